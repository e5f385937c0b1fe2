"""Thinking models without the server: the chat templates' rendering with enable_thinking, the
detection of a thinking template, the split of a reply (whole and streamed), the token count and
budget of its block, and how `mnngpu run` / `chat` show it.

Truths: transformers' apply_chat_template over the same template and variables; a reference
parser written here (one regex over the whole text); the tokenizer's own ids for the markers.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
import pytest

from mnngpu.apps.server.reasoning import (
    BudgetSampler,
    ReasoningSplitter,
    ReasoningTokens,
    ThinkMarkers,
    detect_thinking,
    split_reasoning,
)
from mnngpu.prompt import Prompt
from mnngpu.tokenizer import load_tokenizer
from tests.reference_model import MODEL_DIR

DATA = Path(__file__).resolve().parent / "data" / "thinking"
QWEN3_STYLE = (DATA / "qwen3_style.jinja").read_text()
R1_STYLE = (DATA / "r1_style.jinja").read_text()
CHATML = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}" \
         "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
HISTORY = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Is 9 prime?"},
           {"role": "assistant", "content": "<think>\n9 = 3 x 3.\n</think>\n\nNo."},
           {"role": "user", "content": "And 7?"}]


def prompt_of(template: str, context: dict | None = None) -> Prompt:
    return Prompt({"jinja": {"chat_template": template, "eos": "<|im_end|>", "context": context or {}}})


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(MODEL_DIR, "tokenizer.mtok")


@pytest.fixture(scope="module")
def hf():
    transformers = pytest.importorskip("transformers")
    return transformers.PreTrainedTokenizerFast(tokenizer_file=str(MODEL_DIR / "hf" / "tokenizer.json"))


def reference_split(text: str, inside: bool) -> tuple[str | None, str | None]:
    """(reasoning, answer) by one regex over the whole reply: a block only at its start."""
    whole = "<think>" + text if inside else text
    closed = re.fullmatch(r"\s*<think>(.*?)</think>\s*(.*)", whole, re.DOTALL)
    if closed:
        return closed.group(1).strip(), closed.group(2)
    opened = re.fullmatch(r"\s*<think>(.*)", whole, re.DOTALL)
    if opened:
        return opened.group(1).strip(), None
    return None, text


# ---- the templates ---------------------------------------------------------------------------------


@pytest.mark.parametrize("template", [QWEN3_STYLE, R1_STYLE], ids=["qwen3_style", "r1_style"])
@pytest.mark.parametrize("variables", [{}, {"enable_thinking": False}, {"enable_thinking": True},
                                       {"enable_thinking": False, "custom_flag": "x"}])
def test_rendering_equals_transformers(hf, template, variables):
    ours = prompt_of(template).render(HISTORY, True, variables=variables)
    truth = hf.apply_chat_template(HISTORY, chat_template=template, tokenize=False, add_generation_prompt=True,
                                   **variables)
    assert ours == truth
    assert "9 = 3 x 3" not in ours   # an earlier turn's thinking is left out, as Qwen3's template does


def test_enable_thinking_false_renders_the_empty_block():
    prompt = prompt_of(QWEN3_STYLE)
    off = prompt.render(HISTORY, True, variables={"enable_thinking": False})
    on = prompt.render(HISTORY, True)
    assert off == on + "<think>\n\n</think>\n\n"


def test_jinja_context_gives_the_default_and_a_request_overrides_it():
    prompt = prompt_of(QWEN3_STYLE, {"enable_thinking": False})
    assert prompt.render(HISTORY, True).endswith("</think>\n\n")
    assert prompt.render(HISTORY, True, variables={"enable_thinking": True}).endswith("<|im_start|>assistant\n")


# ---- detection -------------------------------------------------------------------------------------------


def test_detection_reads_the_template_and_the_tokenizer(tokenizer):
    qwen3 = detect_thinking(prompt_of(QWEN3_STYLE), tokenizer)
    assert qwen3.markers == ThinkMarkers("<think>", "</think>")
    assert qwen3.switch == "enable_thinking" and qwen3.on_by_default
    assert list(qwen3.end_ids) == tokenizer.encode("</think>")[len(tokenizer.prefix_ids):]
    assert len(qwen3.end_ids) > 1 and not qwen3.special_ids   # the markers are plain text here
    r1 = detect_thinking(prompt_of(R1_STYLE), tokenizer)
    assert r1.switch is None and r1.on_by_default
    assert r1.opens_block(prompt_of(R1_STYLE).render(HISTORY, True))
    assert not qwen3.opens_block(prompt_of(QWEN3_STYLE).render(HISTORY, True))
    assert detect_thinking(prompt_of(CHATML), tokenizer) is None
    assert not detect_thinking(prompt_of(QWEN3_STYLE, {"enable_thinking": False}), tokenizer).on_by_default


def test_detection_takes_the_templates_own_markers(tokenizer):
    seed = QWEN3_STYLE.replace("<think>", "<seed:think>").replace("</think>", "</seed:think>")
    thinking = detect_thinking(prompt_of(seed), tokenizer)
    assert thinking.markers == ThinkMarkers("<seed:think>", "</seed:think>")


# ---- the split --------------------------------------------------------------------------------------------

REPLIES = [
    "<think>\nLet me see: 7 has no divisor.\n</think>\n\nYes, 7 is prime.",
    "  <think>a</think>b",
    "<think></think>",
    "<think>\n\n</think>\n\n  answer with < and </ inside",
    "<think>cut off in the middle, with a partial </thi",
    "<think>cut off after whitespace \n\n",
    "No block at all. <think>not at the start</think> stays.",
    "   ",
    "<thi",
    "<thinking>is not the marker</thinking>",
    "reasoning the prompt opened</think>\nthe answer",
    "</think>",
    "",
]


@pytest.mark.parametrize("inside", [False, True])
@pytest.mark.parametrize("text", REPLIES)
def test_the_split_equals_the_reference_parser(text, inside):
    split = split_reasoning(text, ThinkMarkers(), inside)
    assert (split.reasoning, split.content) == reference_split(text, inside)


def streamed(pieces: list[str], inside: bool) -> tuple[str, str]:
    splitter = ReasoningSplitter(ThinkMarkers(), inside)
    reasoning = content = ""
    for piece in [*pieces, None]:
        delta = splitter.feed(piece) if piece is not None else splitter.finish()
        reasoning, content = reasoning + delta.reasoning, content + delta.content
    return reasoning, content


@pytest.mark.parametrize("inside", [False, True])
@pytest.mark.parametrize("text", REPLIES)
def test_a_stream_splits_as_the_whole_text_in_any_pieces(tokenizer, text, inside):
    truth = reference_split(text, inside)
    expected = (truth[0] or "", truth[1] or "")
    tokens = [tokenizer.decode(i) for i in tokenizer.encode(text)[len(tokenizer.prefix_ids):]]
    assert "".join(tokens) == text
    for pieces in ([text], list(text), tokens, [text[:k] for k in (3,)] + [text[3:]]):
        assert streamed(pieces, inside) == expected


# ---- tokens: the count and the budget ----------------------------------------------------------------------


class Scripted:
    """A sampler that takes the likeliest token, over logits that make each step's scripted token
    the likeliest; what it sampled is in `taken`."""

    def __init__(self, vocab: int, script: list[int]):
        self.vocab, self.script, self.taken = vocab, list(script), []

    def logits(self) -> np.ndarray:
        row = np.zeros(self.vocab, np.float32)
        row[self.script[len(self.taken) % len(self.script)]] = 5.0
        return row

    def sample(self, logits, history) -> int:
        token = int(np.argmax(logits))
        self.taken.append(token)
        return token


def run_sampler(tokenizer, template: str, script: list[int], steps: int, budget: int) -> tuple[list[int], int]:
    thinking = detect_thinking(prompt_of(template), tokenizer)
    inside = thinking.opens_block(prompt_of(template).render(HISTORY, True))
    inner = Scripted(tokenizer.vocab_size, script)
    counter = ReasoningTokens(thinking, tokenizer, inside, budget)
    sampler = BudgetSampler(inner, counter, stop_ids=frozenset(tokenizer.stop_ids))
    for _ in range(steps):
        sampler.sample(inner.logits(), [])
    return inner.taken, counter.reasoning_tokens


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text)[len(tokenizer.prefix_ids):]


@pytest.mark.parametrize("budget", [0, 1, 5])
def test_the_budget_closes_a_block_the_prompt_opened(tokenizer, budget):
    a = ids(tokenizer, "a")
    end = ids(tokenizer, "</think>")
    taken, reasoning_tokens = run_sampler(tokenizer, R1_STYLE, a, budget + len(end) + 4, budget)
    assert taken == a * budget + end + a * 4
    assert reasoning_tokens == budget + len(end)
    text = "".join(tokenizer.decode(i) for i in taken)
    assert reference_split(text, True) == ("a" * budget, "a" * 4)


def test_the_budget_counts_from_the_start_marker_the_model_writes(tokenizer):
    opening, a, end = ids(tokenizer, "<think>"), ids(tokenizer, "a"), ids(tokenizer, "</think>")
    taken, reasoning_tokens = run_sampler(tokenizer, QWEN3_STYLE, opening + a * 20, len(opening) + 3 + len(end), 3)
    assert taken == opening + a * 3 + end
    assert reasoning_tokens == len(taken)


def test_no_budget_and_a_block_never_closed_counts_every_token(tokenizer):
    a = ids(tokenizer, "a")
    taken, reasoning_tokens = run_sampler(tokenizer, R1_STYLE, a, 9, -1)
    assert taken == a * 9 and reasoning_tokens == 9
    taken, reasoning_tokens = run_sampler(tokenizer, QWEN3_STYLE, a, 9, 2)   # no block: no budget, no count
    assert taken == a * 9 and reasoning_tokens == 0


# ---- markers that are one added token each -----------------------------------------------------------------


def test_markers_as_added_special_tokens(thinking_model_dir):
    tokenizer = load_tokenizer(thinking_model_dir, "tokenizer.txt")
    start, end = ids(tokenizer, "<think>"), ids(tokenizer, "</think>")
    assert len(start) == 1 and len(end) == 1 and tokenizer.is_special(start[0]) and tokenizer.is_special(end[0])
    thinking = detect_thinking(prompt_of(QWEN3_STYLE), tokenizer)
    assert thinking.special_ids == {start[0], end[0]} and list(thinking.end_ids) == end
    a = ids(tokenizer, "a")
    taken, reasoning_tokens = run_sampler(tokenizer, QWEN3_STYLE, start + a * 9, 1 + 2 + 1 + 3, 2)
    assert taken == start + a * 2 + end + a * 3 and reasoning_tokens == 4


# ---- the CLI's view --------------------------------------------------------------------------------------------


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("kind", [io.StringIO, Terminal], ids=["pipe", "terminal"])
@pytest.mark.parametrize("show", [True, False])
def test_the_cli_shows_thinking_apart(tokenizer, kind, show):
    from mnngpu.apps.commands.chat import DIM, UNDIM, reply_printer

    out = kind()
    thinking = detect_thinking(prompt_of(QWEN3_STYLE), tokenizer)
    text = "<think>\nweighing it\n</think>\n\nThe answer."
    printer = reply_printer(out, thinking, False, show)
    for token in ids(tokenizer, text):
        printer(tokenizer.decode(token))
    printer.finish()
    dim = out.isatty()
    thought = (DIM if dim else "") + "weighing it" + (UNDIM if dim else "") + "\n\n"
    assert out.getvalue() == (thought if show else "") + "The answer."
    assert printer.answer == "The answer."


@pytest.fixture(scope="module")
def thinking_model_dir(tmp_path_factory):
    from tests.thinking_model import make_thinking_model

    return make_thinking_model(tmp_path_factory.mktemp("thinking") / "model", QWEN3_STYLE)


# ---- mnngpu chat and mnngpu run ----------------------------------------------------------------------------


def hf_prompt_tokens(hf, template: str, messages: list[dict], **variables) -> int:
    text = hf.apply_chat_template(messages, chat_template=template, tokenize=False, add_generation_prompt=True,
                                  **variables)
    return len(hf(text)["input_ids"])


def test_think_off_in_chat_renders_the_empty_block(hf):
    from mnngpu.apps.chat import ChatSession
    from mnngpu.apps.commands.chat import chat_loop
    from tests.reference_model import load_model

    session = ChatSession(load_model(jinja={"chat_template": QWEN3_STYLE, "eos": "<|im_end|>"}))
    question = [{"role": "user", "content": "Is 7 prime?"}]
    assert session.ask("Is 7 prime?", max_new_tokens=2).prompt_tokens == hf_prompt_tokens(hf, QWEN3_STYLE, question)
    session.reset()
    lines, out, err = iter(["/think off", "/think maybe"]), io.StringIO(), io.StringIO()

    def read_line(prompt: str) -> str:
        line = next(lines, None)
        if line is None:
            raise EOFError
        return line

    assert chat_loop(session, read_line, out, err) == 0
    assert err.getvalue() == "thinking off.\nerror: expected /think on or /think off\n"
    reply = session.ask("Is 7 prime?", max_new_tokens=2)
    assert reply.prompt_tokens == hf_prompt_tokens(hf, QWEN3_STYLE, question, enable_thinking=False)


@pytest.mark.parametrize("template, message", [(R1_STYLE, "cannot switch thinking"), (CHATML, "does not think")])
def test_think_where_the_template_cannot_switch_says_so(template, message):
    from mnngpu.apps.chat import ChatSession
    from mnngpu.apps.commands.chat import chat_loop
    from tests.reference_model import load_model

    session = ChatSession(load_model(jinja={"chat_template": template, "eos": "<|im_end|>"}))
    lines, err = iter(["/think off"]), io.StringIO()

    def read_line(prompt: str) -> str:
        line = next(lines, None)
        if line is None:
            raise EOFError
        return line

    chat_loop(session, read_line, io.StringIO(), err)
    assert err.getvalue().startswith("error: /think: ") and message in err.getvalue()


def test_run_shows_the_thinking_apart_or_hides_it(thinking_r1_dir):
    """The r1-style prompt opens the block and the markers are special tokens: a greedy reply of the
    random model is all thinking unless it writes </think>; the reply's text comes from
    generate_reply in this process, split by the reference parser."""
    import subprocess
    import sys

    from mnngpu import llm as llm_module
    from mnngpu.apps.chat import PromptCache, generate_reply

    model = llm_module.create(thinking_r1_dir / "config.json")
    model.set_config({"sampler_type": "greedy", "precision": "high", "thread_num": 2})
    model.load()
    thinking = detect_thinking(model.prompt, model.tokenizer)
    text = model.prompt.apply_chat_template("hi")
    reply = generate_reply(model, PromptCache(model), text, 6, shown_ids=thinking.special_ids)
    reasoning, content = reference_split(reply.text, inside=True)
    expected = reasoning + ("\n\n" + content if content else "") if reasoning else content or ""

    def run(*extra: str) -> str:
        done = subprocess.run([sys.executable, "-m", "mnngpu", "run", str(thinking_r1_dir), "-p", "hi", "-n", "6",
                               "--sampler", "greedy", "--precision", "high", "-t", "2", *extra],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert run() == expected + "\n"
    assert run("--no-think") == (content or "") + "\n"


@pytest.fixture(scope="module")
def thinking_r1_dir(tmp_path_factory):
    from tests.thinking_model import make_thinking_model

    return make_thinking_model(tmp_path_factory.mktemp("thinking_r1") / "model", R1_STYLE)
