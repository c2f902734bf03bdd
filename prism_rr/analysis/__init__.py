"""The execution graph over a bundle's events: matching, per-step analysis, attribution, diagnosis, diff, export.

Reads bundles only through `prism_rr.format`; imports neither torch nor a UI library.
"""

from prism_rr.analysis._attribution import (
    RankTime,
    StepAttribution,
    StragglerCost,
    attribute,
    attribute_step,
    attribution_json,
    attribution_json_text,
    attribution_lines,
    retimed_span,
    step_json,
    straggler_lines,
    straggler_totals,
)
from prism_rr.analysis._attempts import attempt_findings
from prism_rr.analysis._build import ExecutionGraph, build_graph, clock_offset, clock_offsets, signature
from prism_rr.analysis._chakra import export_chakra
from prism_rr.analysis._chrome import export_chrome
from prism_rr.analysis._columns import ColumnReader
from prism_rr.analysis._diagnose import (
    KINDS,
    WINDOW_EVENTS,
    Finding,
    diagnose,
    diagnosis_json,
    finding_lines,
    step_windows,
)
from prism_rr.analysis._divergence import (
    CallDivergence,
    call_divergence,
    call_divergences,
    call_structure,
    data_checked,
    replay_data,
    structure_of,
)
from prism_rr.analysis._diff import BundleDiff, SequenceDifference, diff_bundles, diff_json, diff_lines
from prism_rr.analysis._model import MatchedCall, Member, P2PMatch, RankTrace, StepStats
from prism_rr.analysis._parquet import export_parquet
from prism_rr.analysis._steps import (
    CLOCKS,
    CriticalPath,
    Segment,
    StepAnalysis,
    StepDurations,
    analyze_step,
    step_durations,
)

__all__ = [
    "BundleDiff",
    "CLOCKS",
    "CallDivergence",
    "ColumnReader",
    "CriticalPath",
    "ExecutionGraph",
    "Finding",
    "KINDS",
    "MatchedCall",
    "Member",
    "P2PMatch",
    "RankTime",
    "RankTrace",
    "Segment",
    "SequenceDifference",
    "StepAnalysis",
    "StepAttribution",
    "StepDurations",
    "StepStats",
    "StragglerCost",
    "WINDOW_EVENTS",
    "analyze_step",
    "attempt_findings",
    "attribute",
    "attribute_step",
    "attribution_json",
    "attribution_json_text",
    "attribution_lines",
    "build_graph",
    "call_divergence",
    "call_divergences",
    "call_structure",
    "clock_offset",
    "clock_offsets",
    "data_checked",
    "diagnose",
    "diagnosis_json",
    "diff_bundles",
    "diff_json",
    "diff_lines",
    "export_chakra",
    "export_chrome",
    "export_parquet",
    "finding_lines",
    "replay_data",
    "retimed_span",
    "signature",
    "step_windows",
    "step_durations",
    "step_json",
    "straggler_lines",
    "straggler_totals",
    "structure_of",
]
