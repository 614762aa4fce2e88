"""Leaks grouped by the whole chain of user frames, as ``tracemalloc`` groups by traceback:
each chain its own group with its own count, bytes and shapes, shown outer to inner from the
checked block's line (``a.py:54 in f → b.py:154 in g``), at most 8 frames (the middle elided).
A frame in JAX, NumPy or another library tidyjax knows is never part of a chain; the user's
own installed package is."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tidyjax as tj
from tidyjax._sites import PACKAGE_FOLDERS, Site, is_user_file

from .conftest import line_of

HERE = os.path.relpath(__file__)
HERE = __file__ if HERE.startswith(os.pardir) else HERE


def _at(marker: str, function: str) -> str:
    return f"{HERE}:{line_of(marker)} in {function}"


def _names(site: Site | None) -> list[tuple[int, str]]:
    """A chain as (line, bare function name): newer JAX names a function by its qualified
    name, JAX 0.6 by its bare one."""
    assert site is not None
    return [(f.line, f.function.rsplit(".", 1)[-1]) for f in site.frames]


CACHE: list[jax.Array] = []


def helper_big() -> None:
    CACHE.append(jnp.ones(100))  # CHAIN:big


def helper_small() -> None:
    CACHE.append(jnp.ones(3))  # CHAIN:small


def train() -> None:
    for _ in range(3):
        helper_big()  # CHAIN:train-big
        helper_small()  # CHAIN:train-small


@pytest.fixture(autouse=True)
def _empty_cache():
    CACHE.clear()
    yield
    CACHE.clear()


def test_two_helpers_leaking_under_one_call_are_two_groups_with_their_own_counts():
    with pytest.raises(tj.LeakError) as err, tj.check_leaks():
        train()  # CHAIN:block
    report = err.value.report
    name = "test_two_helpers_leaking_under_one_call_are_two_groups_with_their_own_counts"
    block = (line_of("CHAIN:block"), name)
    groups = {tuple(_names(g.site)): g for g in report.array_groups}
    big = (block, (line_of("CHAIN:train-big"), "train"), (line_of("CHAIN:big"), "helper_big"))
    small = (
        block,
        (line_of("CHAIN:train-small"), "train"),
        (line_of("CHAIN:small"), "helper_small"),
    )
    assert set(groups) == {big, small}
    assert (groups[big].count, groups[big].bytes) == (3, 1200)
    assert groups[big].shapes == {"float32[100]": 3}
    assert (groups[small].count, groups[small].bytes) == (3, 36)
    assert groups[small].shapes == {"float32[3]": 3}
    text = str(report)
    # outer to inner; module-level functions: bare and qualified names agree
    big_chain = f"{_at('CHAIN:train-big', 'train')} → {_at('CHAIN:big', 'helper_big')}"
    small_chain = f"{_at('CHAIN:train-small', 'train')} → {_at('CHAIN:small', 'helper_small')}"
    assert f"{_at('CHAIN:block', name)} → {big_chain}: 3 untracked arrays" in text
    assert f"{_at('CHAIN:block', name)} → {small_chain}: 3 untracked arrays" in text
    assert "through" not in text
    assert "→" in report._repr_html_()


def _leak_here() -> None:
    CACHE.append(jnp.zeros(2))  # CHAIN:shared


def caller_one() -> None:
    _leak_here()  # CHAIN:one


def caller_two() -> None:
    _leak_here()  # CHAIN:two


def test_one_leaking_line_reached_through_two_callers_is_two_groups():
    with pytest.raises(tj.LeakError) as err, tj.check_leaks():
        for call in (caller_one, caller_two, caller_two):
            call()  # one line of the block: the chains differ by the caller alone
    groups = err.value.report.array_groups
    assert sorted((_names(g.site)[1:], g.count) for g in groups) == [
        ([(line_of("CHAIN:one"), "caller_one"), (line_of("CHAIN:shared"), "_leak_here")], 1),
        ([(line_of("CHAIN:two"), "caller_two"), (line_of("CHAIN:shared"), "_leak_here")], 2),
    ]
    # the site itself (its file, line and function) is the block's line, as before
    assert all(g.site is not None and g.site.function.endswith("two_groups") for g in groups)


def _deep(n: int) -> None:
    if n == 0:
        CACHE.append(jnp.ones(1))  # CHAIN:deep-leak
        return
    _deep(n - 1)  # CHAIN:deep-call


def test_a_chain_deeper_than_eight_frames_is_elided_in_the_middle():
    with pytest.raises(tj.LeakError) as err, tj.check_leaks():
        _deep(10)  # CHAIN:deep-block
    (group,) = err.value.report.array_groups
    assert group.site is not None and len(group.site.frames) == 12  # the block, 11 calls
    label = group.site.label
    parts = label.split(" → ")
    assert len(parts) == 9 and parts[4] == "…"
    assert parts[0].startswith(f"{HERE}:{line_of('CHAIN:deep-block')} in ")
    assert parts[-1].startswith(f"{HERE}:{line_of('CHAIN:deep-leak')} in ")
    assert label in str(err.value)


def _leak_one(x: jax.Array) -> jax.Array:
    CACHE.append(x + 1)  # CHAIN:mapped
    return x


def test_frames_in_jax_and_numpy_are_never_part_of_a_chain():
    def through_libraries() -> None:
        jax.tree.map(_leak_one, [jnp.ones(2)])  # CHAIN:jax-call
        np.apply_along_axis(lambda row: _leak_one(jnp.asarray(row)).sum(), 0, np.ones((2, 1)))

    with pytest.raises(tj.LeakError) as err, tj.check_leaks():
        through_libraries()
    for g in err.value.report.array_groups:
        assert g.site is not None
        assert all(is_user_file(f.file) and f.file == __file__ for f in g.site.frames)
        assert _names(g.site)[-1] == (line_of("CHAIN:mapped"), "_leak_one")
    assert sum(g.count for g in err.value.report.array_groups) == 2


def test_a_users_own_installed_package_is_user_code_a_known_library_is_not():
    folder = PACKAGE_FOLDERS[0]
    assert is_user_file(os.path.join(folder, "my_company_models", "net.py"))
    assert is_user_file(os.path.join(folder, "my_module.py"))
    for lib in ("numpy", "flax", "optax", "equinox", "_pytest", "pluggy", "IPython"):
        assert not is_user_file(os.path.join(folder, lib, "x.py"))
    assert not is_user_file(jnp.__file__) and not is_user_file(json.__file__)
    # a function compiled as if installed in the user's own package is a frame of the chain
    own = os.path.join(folder, "my_company_models", "net.py")
    namespace = {"jnp": jnp, "CACHE": CACHE}
    exec(compile("def forward():\n    CACHE.append(jnp.ones(5))\n", own, "exec"), namespace)
    with pytest.raises(tj.LeakError) as err, tj.check_leaks():
        namespace["forward"]()  # CHAIN:own
    (group,) = err.value.report.array_groups
    assert group.site is not None and [f.file for f in group.site.frames] == [__file__, own]


def test_the_decorator_form_and_memory_use_the_same_chains():
    @tj.check_leaks()
    def step() -> None:
        train()  # CHAIN:decorated

    with pytest.raises(tj.LeakError) as err:
        step()
    # The inner end of each chain: train's line, then the helper's (on JAX 0.6.2 the chain also
    # starts one frame further out, at this test's call of step()).
    decorated = {tuple(_names(g.site)[-2:]) for g in err.value.report.array_groups}
    big = ((line_of("CHAIN:train-big"), "train"), (line_of("CHAIN:big"), "helper_big"))
    small = ((line_of("CHAIN:train-small"), "train"), (line_of("CHAIN:small"), "helper_small"))
    assert decorated == {big, small}
    for g in err.value.report.array_groups:  # the decorated function's line leads to both
        assert (line_of("CHAIN:decorated"), "step") in _names(g.site)
    # memory(): the same chains, from the outermost user frame (this test) inward
    sites = tj.memory().untracked_sites
    mine = {tuple(_names(s.site)[-2:]): s.count for s in sites
            if s.site is not None and s.site.file == __file__}  # fmt: skip
    assert mine[big] == 3 and mine[small] == 3


def test_a_snapshot_compares_by_chain_and_one_of_format_1_still_loads(tmp_path):
    before = tj.snapshot()
    caller_one()
    caller_two()
    after = tj.snapshot()
    rows = [d for d in after.compare_to(before) if d.site is not None and d.site.file == __file__]
    assert sorted((_names(d.site)[-2][1], d.count_diff) for d in rows) == [
        ("caller_one", 1),
        ("caller_two", 1),
    ]
    path = tmp_path / "new.json"
    after.dump(path)
    data = json.loads(path.read_text())
    assert data["version"] == 2
    again = tj.Snapshot.load(path)
    assert {s.site for s in again.statistics()} == {s.site for s in after.statistics()}
    # format 1: no chains (each site one frame); it loads and compares
    for record in data["tensors"]:
        if record.get("site"):
            record["site"].pop("chain", None)
    data["version"] = 1
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data))
    loaded = tj.Snapshot.load(old)
    assert all(s.site is None or s.site.chain == () for s in loaded.statistics())
    shared = [s for s in loaded.statistics() if s.site is not None and s.site.file == __file__]
    assert [(s.site.line, s.count) for s in shared] == [(line_of("CHAIN:shared"), 2)]
    CACHE.clear()
    diffs = [d for d in tj.snapshot().compare_to(loaded) if d.site is not None]
    assert any(d.site.line == line_of("CHAIN:shared") and d.count_diff == -2 for d in diffs)
