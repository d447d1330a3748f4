"""BERT and the encoders that read its config as it does (DistilBERT, ELECTRA)."""

from pooltriton.core.families.family import Family

FAMILY = Family(("bert", "distilbert", "electra"), cls_default=True, self_pooling_head=True)
