"""Evaluation: a code sandbox, HumanEval pass@1, on-policy KL and NLL, perplexity and repetition metrics."""
