"""Load generation for vtui: workloads, arrivals, a streaming client and statistics with
``vllm bench serve``'s definitions. No Textual or Rich here: usable from plain scripts."""

from loadgen.datafile import DatasetError
from loadgen.records import PlannedRequest, RequestResult
from loadgen.run import LoadRun, RunResult, ServerError, check_lengths, probe_server
from loadgen.spec import SLO, ArrivalSpec, SpecError, WorkloadSpec
from loadgen.stats import LoadSummary, Percentiles, StatsWindow, percentile

__all__ = [
    "SLO", "ArrivalSpec", "DatasetError", "LoadRun", "LoadSummary", "Percentiles", "PlannedRequest",
    "RequestResult", "RunResult", "ServerError", "SpecError", "StatsWindow", "WorkloadSpec",
    "check_lengths", "percentile", "probe_server",
]
