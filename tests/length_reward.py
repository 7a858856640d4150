"""A reward for the exactness test: a response's length in characters / 100. The tiny model solves no puzzle (the
puzzle reward is 0 everywhere), and GRPO needs rewards that differ within a group for its advantages, loss and
gradient to be anything but zero."""


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return len(solution_str) / 100.0
