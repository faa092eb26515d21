"""Data: event logs (and MovieLens as one), per-user sequences, leave-one-out splits and sampled examples (numpy
only)."""

from mindspore_relaygr.data.events import Interactions, load_interactions
from mindspore_relaygr.data.movielens import bundled_ml100k_path, load_movielens
from mindspore_relaygr.data.sequences import (
    EvalExample,
    PopularityModel,
    Split,
    Target,
    build_eval_set,
    build_sequences,
    cap_history,
    leave_one_out,
    sample_negatives,
)

__all__ = ["EvalExample", "Interactions", "PopularityModel", "Split", "Target", "build_eval_set", "build_sequences",
           "bundled_ml100k_path", "cap_history", "leave_one_out", "load_interactions", "load_movielens",
           "sample_negatives"]
