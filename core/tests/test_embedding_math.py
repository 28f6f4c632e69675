"""The embedding routes' arithmetic, against references written out by hand: llama-server's
normalization codes, Matryoshka truncation, OpenAI's base64 bytes, the finiteness check,
and how ``input`` shapes become a list of inputs."""

from __future__ import annotations

import base64
import struct

import numpy as np
import pytest
from mlxcel.errors import InvalidRequest, ServerError
from mlxcel.families.tasks import Encoded
from mlxcel.retrieval.embed import MAX_INPUTS, encode, inputs_of
from mlxcel.retrieval.vectors import INT16_MAX, check_finite, normalize, to_base64, truncate

V = np.array([3.0, -4.0, 0.0, 12.0], dtype=np.float32)  # |v|_1 = 19, |v|_2 = 13, max 12


@pytest.mark.parametrize("code,expect", [
    (-1, [3.0, -4.0, 0.0, 12.0]),
    (0, [3 * INT16_MAX / 12, -4 * INT16_MAX / 12, 0.0, INT16_MAX]),
    (1, [3 / 19, -4 / 19, 0.0, 12 / 19]),
    (2, [3 / 13, -4 / 13, 0.0, 12 / 13]),
    (3, [x / (27 + 64 + 1728) ** (1 / 3) for x in (3.0, -4.0, 0.0, 12.0)]),
])
def test_normalize_follows_llama_server_codes(code, expect):
    out = normalize(V, code)
    assert out.dtype == np.float32
    assert np.allclose(out, expect, rtol=1e-6)


def test_normalize_goes_row_by_row_and_leaves_a_zero_vector_zero():
    rows = np.array([[3.0, 4.0], [0.0, 0.0], [-5.0, 12.0]], dtype=np.float32)
    assert np.allclose(normalize(rows, 2), [[0.6, 0.8], [0.0, 0.0], [-5 / 13, 12 / 13]])
    assert np.allclose(normalize(rows, 1), [[3 / 7, 4 / 7], [0.0, 0.0], [-5 / 17, 12 / 17]])
    assert not np.isnan(normalize(np.zeros(3, np.float32), 0)).any()


def test_truncate_then_renormalize_is_matryoshka():
    cut = truncate(V, 2, full=4)
    assert cut.tolist() == [3.0, -4.0]
    assert np.allclose(normalize(cut, 2), [0.6, -0.8])
    assert truncate(V, None, full=4) is V
    assert truncate(V, 4, full=4).tolist() == V.tolist()


@pytest.mark.parametrize("dimensions", [0, -1, 5])
def test_truncate_refuses_sizes_the_model_has_not(dimensions):
    with pytest.raises(InvalidRequest) as err:
        truncate(V, dimensions, full=4)
    assert err.value.param == "dimensions" and "4" in err.value.message


def test_base64_is_little_endian_float32_as_openai_decodes_it():
    raw = base64.b64decode(to_base64(np.array([1.0, -2.5], dtype=np.float64)))
    assert raw == struct.pack("<2f", 1.0, -2.5)
    vec = np.random.default_rng(1).normal(size=64).astype(np.float32)
    assert np.array_equal(np.frombuffer(base64.b64decode(to_base64(vec)), "<f4"), vec)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_value_anywhere_is_a_server_error(bad):
    check_finite([V, np.ones((2, 4), np.float32)])
    rows = np.ones((2, 4), np.float32)
    rows[1, 2] = bad
    with pytest.raises(ServerError):
        check_finite([V, rows])


@pytest.mark.parametrize("value,items", [
    ("a b", ["a b"]), ("", [""]), (["a", "b"], ["a", "b"]), ([1, 2, 3], [[1, 2, 3]]),
    ([[1], [2, 3]], [[1], [2, 3]]),
    # llama-server's forms: a mixed list is one input, objects are their text
    ([12, "ab", 3], [[12, "ab", 3]]), (["a", [1, 2]], ["a", [1, 2]]),
    ([[1, "ab"], [2]], [[1, "ab"], [2]]), ({"prompt_string": "a b"}, ["a b"]),
    ({"content": [{"type": "text", "text": "a "}, {"type": "text", "text": "b"}]}, ["a b"]),
    (["x", {"prompt_string": "y"}], ["x", "y"]),
])
def test_input_shapes_become_a_list_of_inputs(value, items):
    assert inputs_of(value) == items


@pytest.mark.parametrize("value,param", [
    ([], "input"), ([True], "input[0]"), (3, "input"), ({"text": "a"}, "input"),
    ({"content": "a"}, "input"), (["a", None], "input[1]"), ([1.5], "input[0]"),
    ({"content": [{"type": "image_url", "image_url": {"url": "data:,"}}]},
     "input.content[0]"),
    ({"prompt_string": "a", "multimodal_data": ["AAAA"]}, "input.multimodal_data"),
    (["a"] * (MAX_INPUTS + 1), "input"),
])
def test_bad_inputs_are_400s_naming_where(value, param):
    with pytest.raises(InvalidRequest) as err:
        inputs_of(value)
    assert err.value.param == param


class Runner:
    vocab_size, max_length = 10, 3

    def tokenize(self, text: str) -> Encoded:
        return Encoded([len(w) for w in text.split()])


def test_encode_checks_vocabulary_and_length_and_names_the_input():
    assert [e.ids for e in encode(Runner(), ["ab c", [9, 0]])] == [[2, 1], [9, 0]]
    for items, param in (([[1], [10]], "input[1]"), (["a b c d"], "input"),
                         (["a", "a b c d"], "input[1]"), ([[-1]], "input[0]"),
                         ([""], "input"), (["a", []], "input[1]"), ([[1, 12, "a"]], "input[0]")):
        with pytest.raises(InvalidRequest) as err:
            encode(Runner(), items)
        assert err.value.param == param
    with pytest.raises(InvalidRequest, match="too large"):
        encode(Runner(), ["a b c d"])


class PieceRunner(Runner):
    def tokenize_piece(self, text: str) -> list[int]:
        return [len(w) + 5 for w in text.split()]


def test_a_mixed_input_tokenizes_its_texts_in_place():
    assert encode(Runner(), [[1, "abc", 2]])[0].ids == [1, 3, 2]
    assert encode(PieceRunner(), [[1, "abc", 2]])[0].ids == [1, 8, 2]


class BatchRunner(Runner):
    """A runner with the optional ``tokenize_batch``: its calls are recorded."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    def tokenize_batch(self, texts):
        self.batches.append(list(texts))
        return [Encoded([len(w) + 1 for w in t.split()]) for t in texts]


def test_encode_takes_a_request_s_texts_in_one_batch_call_where_the_runner_has_one():
    runner = BatchRunner()
    got = encode(runner, ["ab c", [9, 0], "a"])
    assert runner.batches == [["ab c", "a"]]  # the texts only, once, in order
    assert [e.ids for e in got] == [[3, 2], [9, 0], [2]]
    with pytest.raises(InvalidRequest) as err:  # still named by the input's own index
        encode(BatchRunner(), ["a", [1], "a b c d"])
    assert err.value.param == "input[2]"
    lone = BatchRunner()
    assert [e.ids for e in encode(lone, ["ab c"])] == [[2, 1]] and lone.batches == []
