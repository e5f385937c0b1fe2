"""The short fuzz run (about a minute on two cores): mutated real fixture files never crash a reader.

Every case must end in the reader's result or an MnnGpuError; another exception, a crash or a
case longer than CASE_SECONDS fails the test. tools/fuzz.py runs the same targets for as many
cases as asked, in worker processes that survive a segfault.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tools.fuzz_targets import DEFAULT_TARGETS, mutate, run_case, targets, time_limit

CASE_SECONDS = 30
# Examples per target, sized so the whole file takes about a minute on two busy cores.
EXAMPLES = {"graph": 1000, "weights": 800, "embedding": 800, "tokenizer": 1200, "config": 1200}
TARGETS = targets()


def mutation_lists(kinds: tuple[str, ...]):
    word = st.integers(0, 2**32 - 1)
    return st.lists(st.tuples(st.sampled_from(kinds), word, word), min_size=1, max_size=8)


@pytest.mark.parametrize("name", DEFAULT_TARGETS)
def test_mutated_files_raise_only_mnngpu_errors(name, tmp_path):
    target = TARGETS[name]
    assert target.sources, f"no fixture files for the {name} target"

    @settings(max_examples=EXAMPLES[name], deadline=None, print_blob=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(source=st.sampled_from(target.sources), mutations=mutation_lists(target.kinds))
    def case(source, mutations):
        with time_limit(CASE_SECONDS):
            run_case(target, source, mutations, tmp_path / "scratch")

    case()


@pytest.mark.parametrize("name", DEFAULT_TARGETS)
def test_every_unmutated_fixture_file_is_accepted(name, tmp_path):
    # The harness itself must not reject good input: otherwise every case above passes trivially.
    target = TARGETS[name]
    for source in target.sources:
        assert run_case(target, source, [], tmp_path / "scratch") == "accepted", source


def test_mutations_change_the_bytes_and_replay_exactly():
    data = bytes(range(256)) * 4
    mutations = [("u32", 17, 5), ("flip", 3, 9), ("insert", 1000, 77), ("truncate", 700, 0)]
    once, again = mutate(data, mutations), mutate(data, mutations)
    assert once == again and once != data
    assert len(once) == 700
    assert mutate(b'{"a": 1, "b": [2]}', [("json_delete", 0, 0)]) == b'{"b": [2]}'


def test_a_wordpiece_file_left_with_no_tokens_is_a_tokenizer_error(tmp_path):
    """A case the fuzz run found: the BERT fixture cut short, then a line of it changed, leaves a
    vocabulary of no tokens; that is one TokenizerError, not an IndexError."""
    target = TARGETS["tokenizer"]
    source = next(s for s in target.sources if s.parent.name == "bert")
    assert run_case(target, source, [("truncate", 63683, 0), ("line", 1826605, 0)],
                    tmp_path / "scratch") == "TokenizerError"
