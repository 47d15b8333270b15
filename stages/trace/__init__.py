"""Public serving traces as workloads: Azure LLM inference, BurstGPT, Mooncake, ShareGPT and
Vidur files become requests with the trace's arrivals and lengths.

One module per job: `formats` (which format a file is), `fields` (a row's values), one reader
per format (`csv_traces` for Azure, BurstGPT and Vidur; `mooncake`; `sharegpt`), `prompt_ids`
(a token-count row's ids, drawn from `seed` when first used) and `workload` (the requests).
"""

from stages.trace.fields import datetime_seconds
from stages.trace.formats import FORMATS, TraceFormat, detect_format, resolve_format
from stages.trace.prompt_ids import PREFIX_KEY, PromptIdSource, SeededPromptIds, prompt_vocab
from stages.trace.workload import TooLong, TraceWorkload

__all__ = [
    "FORMATS",
    "PREFIX_KEY",
    "PromptIdSource",
    "SeededPromptIds",
    "TooLong",
    "TraceFormat",
    "TraceWorkload",
    "datetime_seconds",
    "detect_format",
    "prompt_vocab",
    "resolve_format",
]
