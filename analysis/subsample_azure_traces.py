"""Rebuild the shipped request traces from the Azure LLM inference traces of 2023.

Usage: ``python analysis/subsample_azure_traces.py PATH/TO/AzurePublicDataset`` (a checkout of
github.com/Azure/AzurePublicDataset). Writes ``traces/requests/azure-conv-2023.csv`` and
``traces/requests/azure-code-2023.csv``: the first ``ROWS`` requests of each trace, their arrival times in seconds
after the first request (exact to the source's 100 ns), their context (prompt) and generated
(output) token counts unchanged. See traces/requests/README.md.
"""

from __future__ import annotations

import calendar
import csv
import sys
from datetime import datetime
from pathlib import Path

ROWS = 5000
SOURCES = {"azure-conv-2023.csv": "data/AzureLLMInferenceTrace_conv.csv",
           "azure-code-2023.csv": "data/AzureLLMInferenceTrace_code.csv"}


def _ticks(stamp: str) -> int:
    """``2023-11-16 18:15:46.6805900`` as an integer count of 100 ns ticks."""
    day, _, fraction = stamp.partition(".")
    whole = datetime.strptime(day, "%Y-%m-%d %H:%M:%S")
    return calendar.timegm(whole.timetuple()) * 10_000_000 + int((fraction + "0000000")[:7])


def main(root: str) -> None:
    here = Path(__file__).resolve().parents[1] / "traces" / "requests"
    for name, source in SOURCES.items():
        with open(Path(root) / source, newline="", encoding="utf-8-sig") as f:
            rows = list(csv.DictReader(f))[:ROWS]
        t0 = _ticks(rows[0]["TIMESTAMP"])
        with open(here / name, "w", newline="", encoding="utf-8") as out:
            out.write("arrival_s,prompt_tokens,output_tokens\n")
            for row in rows:
                ticks = _ticks(row["TIMESTAMP"]) - t0
                out.write(f"{ticks // 10_000_000}.{ticks % 10_000_000:07d},{int(row['ContextTokens'])},"
                          f"{int(row['GeneratedTokens'])}\n")


if __name__ == "__main__":
    main(sys.argv[1])
