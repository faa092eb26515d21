"""Data: MovieLens loading, per-user sequences, leave-one-out splits and sampled examples (numpy only)."""

from mindspore_relaygr.data.movielens import Interactions, bundled_ml100k_path, load_movielens
from mindspore_relaygr.data.sequences import (
    NUM_ACTIONS,
    EvalExample,
    PopularityModel,
    Split,
    Target,
    actions_from_ratings,
    build_eval_set,
    build_sequences,
    cap_history,
    leave_one_out,
    sample_negatives,
)

__all__ = ["NUM_ACTIONS", "EvalExample", "Interactions", "PopularityModel", "Split", "Target",
           "actions_from_ratings", "build_eval_set", "build_sequences", "bundled_ml100k_path", "cap_history",
           "leave_one_out", "load_movielens", "sample_negatives"]
