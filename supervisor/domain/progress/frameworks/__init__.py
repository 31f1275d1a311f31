"""One training-log format per framework (Megatron-LM, Hugging Face, NeMo, fairseq, torchtitan, ssv JSONL)."""
