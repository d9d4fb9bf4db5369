"""The training stage: data (digits, image folders), the training loop, evaluation and its plots."""
