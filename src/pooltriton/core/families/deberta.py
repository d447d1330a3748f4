"""DeBERTa: its relative attention reads the plain 0/1 mask as a boolean, so it gets that mask, not the
additive 4-D one. The matrix proves v2 (v1's facts are known, it is not exported)."""

from pooltriton.core.families.family import Family

FAMILY = Family(("deberta-v2",), cls_default=True, self_pooling_head=True, plain_mask=True)
FIRST = Family(("deberta",), supported=False, cls_default=True, self_pooling_head=True, plain_mask=True)
