"""RoBERTa, XLM-RoBERTa, CamemBERT and MPNet: position ids start after the padding index, so the table
holds that many fewer positions."""

from pooltriton.core.families.family import Family

FAMILY = Family(("roberta", "xlm-roberta", "camembert", "mpnet"), cls_default=True, self_pooling_head=True,
                position_offset=True)
