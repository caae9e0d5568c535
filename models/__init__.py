"""Leaf package: model files, formats and quantization. Imports nothing from core/app/ui and never Qt."""
import os

# torch's large CPU tensors on 2 MB pages (madvise): GPTQ's preparation allocates gigabytes of fresh temporaries
# per layer, and 4 KB page faults cost it about 10% (1.5B on a 2-core EPYC: 327 → 299 s). torch reads this once,
# at its first allocation, so it is set before torch loads. THP_MEM_ALLOC_ENABLE=0 turns it off.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
