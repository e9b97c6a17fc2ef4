import pytest

import sparsedecoding
from sparsedecoding import SparsityPattern, SparsityPatternError


@pytest.mark.parametrize("text,n,m", [("2:4", 2, 4), ("4:8", 4, 8), ("8:16", 8, 16), ("16:32", 16, 32),
                                      ("1:3", 1, 3), (" 3 : 7 ", 3, 7)])
def test_nm_patterns_parse(text, n, m):
    pattern = SparsityPattern.parse(text)
    assert (pattern.n, pattern.m, pattern.is_nm) == (n, m, True)
    assert pattern.sparsity == pytest.approx(1 - n / m)
    assert str(SparsityPattern.parse(str(pattern))) == str(pattern)


@pytest.mark.parametrize("text,sparsity", [("50%", 0.5), ("62.5%", 0.625), ("1%", 0.01)])
def test_unstructured_patterns_parse(text, sparsity):
    pattern = SparsityPattern.parse(text)
    assert not pattern.is_nm
    assert pattern.sparsity == pytest.approx(sparsity)


@pytest.mark.parametrize("text", ["3:2", "4:4", "0:4", "2:0", "0%", "100%", "150%", "half", "", "2:4:8", "-1:4",
                                  "2/4", "0.5"])
def test_bad_patterns_raise(text):
    with pytest.raises(SparsityPatternError):
        SparsityPattern.parse(text)


def test_error_message_suggests_a_fix():
    with pytest.raises(SparsityPatternError, match="try 2:4"):
        sparsedecoding.SparsityPattern.parse("3:2")


def test_non_string_rejected():
    with pytest.raises(SparsityPatternError):
        SparsityPattern.parse(24)


@pytest.mark.parametrize("text,overflow", [("16:32+4", 4), ("8:16+0", 0), (" 16 : 32 + 8 ", 8), ("4:8+2", 2)])
def test_capped_patterns_parse_and_print_back(text, overflow):
    pattern = SparsityPattern.parse(text)
    assert pattern.is_nm and pattern.sparsity == 0.5 and pattern.overflow == overflow
    assert SparsityPattern.parse(str(pattern)) == pattern
    assert SparsityPattern.parse("16:32").overflow == -1 and str(SparsityPattern.parse("16:32")) == "16:32"


@pytest.mark.parametrize("text,placement", [("16:32+2l", "lanes"), (" 16:32 + 4 q ", "quads"), ("16:32+2", ""),
                                            (" 16 : 32 g", "groups"), ("16:32g8 ", "groups")])
def test_placed_patterns_parse_and_print_back(text, placement):
    pattern = SparsityPattern.parse(text)
    assert pattern.placement == placement and SparsityPattern.parse(str(pattern)) == pattern
    assert str(pattern).endswith({"lanes": "+2l", "quads": "+4q", "": "+2", "groups": "16:32g"}[placement]
                                 + ("8" if "8 " in text else ""))
    assert pattern.split_rows == (8 if "g8" in text else 0)


@pytest.mark.parametrize("text", ["2:4+1", "16:32+9", "12:32+2", "8:12+1", "16:32+", "16:32+1l", "16:32+2q",
                                  "8:16+2l", "16:32l", "16:32+2x", "8:16g", "16:32g2", "16:32+2g", "2:4g",
                                  "16:32g16", "16:32g4", "8:16g8", "16:32 g 8"])
def test_bad_capped_patterns_raise_one_line(text):
    with pytest.raises(SparsityPatternError) as info:
        SparsityPattern.parse(text)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("fields", [dict(n=3, m=2), dict(n=0, m=4), dict(n=4, m=4), dict(sparsity=1.5), dict(),
                                    dict(n=2, m=4, overflow=3), dict(n=16, m=32, overflow=9),
                                    dict(n=16, m=32, overflow=2, placement="bogus"),
                                    dict(n=16, m=32, overflow=4, placement="lanes"),
                                    dict(n=16, m=32, overflow=2, placement="groups"),
                                    dict(n=8, m=16, placement="groups"),
                                    dict(n=16, m=32, placement="groups", split_rows=4),
                                    dict(n=16, m=32, split_rows=8), dict(sparsity=0.5, split_rows=8),
                                    dict(sparsity=0.5, overflow=2)])
def test_a_pattern_built_directly_is_checked_as_parse_checks_it(fields):
    with pytest.raises(SparsityPatternError, match="SparsityPattern"):
        SparsityPattern(**fields)


def test_every_parsed_pattern_passes_the_direct_check():
    for text in ("2:4", "1:4", "3:8", "16:32", "16:32+0", "16:32+2", "8:16+4", "16:32+2l", "16:32+4q", "16:32g", "50%",
                 "0.5%", "16:32g8"):
        pattern = SparsityPattern.parse(text)
        assert SparsityPattern(pattern.n, pattern.m, pattern.sparsity, pattern.overflow, pattern.placement,
                               pattern.split_rows) == pattern
