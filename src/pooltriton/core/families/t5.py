"""T5 as the encoder of a sentence-transformers embedding only (sentence-t5, GTR: T5EncoderModel, no
decoder); transformers keeps its feed-forward output layers in fp32, as its activations overflow fp16."""

from pooltriton.core.families.family import Family

FAMILY = Family(("t5",), one_use="embed", text_encoder=True, fp16_overflow=True)
