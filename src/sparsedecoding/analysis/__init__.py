"""The paper's two analyses: calibration discrepancy (how far calibration Hessians are from decode-time ones) and
activation drift (how far a pruned model's layer inputs move from the dense model's over decode steps)."""
