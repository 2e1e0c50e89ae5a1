"""bench/pull.py's run order and choice of run: gzip and zstd take turns going first, and the
kept run is the least of the figure asked for."""

from __future__ import annotations

from bench import pull


def test_gzip_and_zstd_take_turns_going_first() -> None:
    order: list[tuple[str, int]] = []
    timings = pull.alternating(3, lambda kind, n: order.append((kind, n)) or {"s": n})
    assert order == [("gzip", 0), ("zstd", 0), ("zstd", 1), ("gzip", 1), ("gzip", 2),
                     ("zstd", 2)]
    assert timings == {"gzip": [{"s": 0}, {"s": 1}, {"s": 2}],
                       "zstd": [{"s": 0}, {"s": 1}, {"s": 2}]}


def test_best_keeps_the_least_of_the_figure_asked_for_and_every_run() -> None:
    runs = [{"s": 1.0, "to_matmul_s": 9.0}, {"s": 2.0, "to_matmul_s": 3.0}]
    assert pull.best(runs) == {**runs[0], "runs": runs}
    assert pull.best(runs, key="to_matmul_s") == {**runs[1], "runs": runs}
