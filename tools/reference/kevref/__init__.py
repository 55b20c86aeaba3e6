"""kevref: the Python reference for kev — tokenizer files, the synthetic release, Kev 1.0's request handling with
Python semantics, the author's fp32 reference arm (plus merged-bf16 and torch-bf16 arms), and the fixture set."""
