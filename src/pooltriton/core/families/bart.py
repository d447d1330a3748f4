"""BART as a sequence classifier only (bart-large-mnli's NLI head reads the decoder's state at the last
</s>: LAST pooling of the decoder here)."""

from pooltriton.core.families.family import Family

FAMILY = Family(("bart",), one_use="classify")
