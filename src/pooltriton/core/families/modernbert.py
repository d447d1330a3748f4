"""ModernBERT: CLS by default; its classification head pools outside (ModernBertPredictionHead)."""

from pooltriton.core.families.family import Family

FAMILY = Family(("modernbert",), cls_default=True)
