"""What an evaluation of the server's parameters measures: the test set and a fixed subset of
the training set (:class:`EvalSets`, :func:`evaluate`), and at the end of a finished run the test
error per class (:func:`class_errors`). When and where they run: :mod:`repro.runs.evaluations`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from repro.asgd.flatnet import FlatNet

TRAIN_SUBSET = 1000  # training-error evaluations use this many fixed training samples


@dataclass
class EvalSets:
    """What an evaluation measures: the test set and a fixed subset of the training set."""

    x_test: Tensor
    y_test: Tensor
    x_train: Tensor
    y_train: Tensor

    @classmethod
    def of(cls, ds) -> "EvalSets":
        """From a :class:`repro.workload.data.Dataset`: its test set, a fixed training subset."""
        n = min(TRAIN_SUBSET, ds.num_train)
        idx = torch.randperm(ds.num_train, generator=torch.Generator().manual_seed(0))[:n]
        idx = idx.to(ds.x_train.device)
        return cls(ds.x_test, ds.y_test, ds.x_train[idx], ds.y_train[idx])


def evaluate(net: FlatNet, params: Tensor, sets: EvalSets) -> dict:
    """Test and train-subset loss and error of ``params`` (evals.csv's metric columns)."""
    test_loss, test_error = net.evaluate(params, sets.x_test, sets.y_test)
    train_loss, train_error = net.evaluate(params, sets.x_train, sets.y_train)
    return {"test_loss": test_loss, "test_error": test_error,
            "train_loss": train_loss, "train_error": train_error}


@torch.no_grad()
def class_errors(net: FlatNet, params: Tensor, sets: EvalSets, batch_size: int = 1024) -> list | None:
    """Test error of ``params`` on each class (index = label; None for a class the test set does
    not hold): summary.json's ``final_class_test_error``. Whether a method starves the classes
    only a slow client holds shows here, not in the mean. None for a loss that is not
    classification (the quadratic's labels mean nothing)."""
    if net.loss_fn is not torch.nn.functional.cross_entropy or not len(sets.y_test):
        return None
    net.load(params)
    outputs = [net.module(sets.x_test[i:i + batch_size]) for i in range(0, len(sets.x_test), batch_size)]
    # counted on the CPU: CUDA's bincount may refuse to run under deterministic algorithms
    predictions, labels = torch.cat([o.argmax(1) for o in outputs]).cpu(), sets.y_test.cpu()
    num_classes = outputs[0].shape[1]   # every class the network tells apart
    held = torch.bincount(labels, minlength=num_classes)[:num_classes].tolist()
    wrong = torch.bincount(labels[predictions != labels], minlength=num_classes)[:num_classes].tolist()
    return [None if n == 0 else w / n for w, n in zip(wrong, held)]
