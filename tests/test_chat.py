"""Multi-turn chat: what each turn prefills with and without reuse_kv, and `mnngpu chat` itself.

Truths: MNN's own runtime run live over three reuse_kv turns; the HF tokenizer and chat
template of the fixture's source; a fresh prefill of the same ids.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from mnngpu.apps.chat import ChatSession, PromptCache, generate_reply
from tests.reference_model import (
    CHAT_PROMPT,
    CHAT_QUESTION,
    CLI_ORACLE_FLAGS,
    MODEL_DIR,
    ORACLE_CONFIG,
    greedy_reply,
    hf_count,
    hf_render,
    load_model,
    stop_ids,
)

TURNS = ["Where does the farmer walk?", "And the teacher?", "Thank you."]
NEW_TOKENS = 6

# MNN's Python binding crashes reading `context` once a reply holds invalid UTF-8 (this random
# fixture's often do), so the script reads only ids and logits: response(text) is, as ids,
# encode(apply_chat_template(text)) then generate; prompt_len is the length of those ids, and
# the logits of one more forward show that both caches hold the same tokens at the same places.
MNN_THREE_TURNS = textwrap.dedent("""
    import json, sys
    import numpy as np
    import MNN.llm as mnn_llm
    model_dir, settings, turns, new_tokens, out = sys.argv[1:]
    llm = mnn_llm.create(model_dir + "/config.json")
    llm.set_config(json.loads(settings))
    llm.load()
    records, seen = [], 0
    for text in json.loads(turns):
        ids = llm.tokenizer_encode(llm.apply_chat_template(text))
        generated = [int(t) for t in llm._c_obj.generate(ids, int(new_tokens))]
        records.append({"prompt_len": len(ids), "new": generated[seen:]})
        seen = len(generated)
    probe = np.array(llm.forward([5]).read(), dtype=np.float32).reshape(-1)
    json.dump({"turns": records, "probe_logits": probe.tolist()}, open(out, "w"))
""")


def test_response_with_reuse_kv_matches_mnn_over_three_turns(tmp_path):
    """Llm.response(text) with reuse_kv keeps the history in the cache and prefills only the
    templated new turn, as MNN's response does; every token it emitted is in the cache."""
    pytest.importorskip("MNN")
    settings = {**ORACLE_CONFIG, "reuse_kv": True, "sampler_type": "greedy"}
    out = tmp_path / "mnn.json"
    subprocess.run([sys.executable, "-c", MNN_THREE_TURNS, str(MODEL_DIR), json.dumps(settings),
                    json.dumps(TURNS), str(NEW_TOKENS), str(out)], check=True, capture_output=True, timeout=120)
    expected = json.loads(out.read_text())

    model = load_model(reuse_kv=True)
    cache_length = 0
    for text, mnn in zip(TURNS, expected["turns"]):
        model.response(text, max_new_tokens=NEW_TOKENS)
        ctx = model.context
        assert ctx.prompt_len == mnn["prompt_len"]
        assert ctx.output_tokens == [t for t in mnn["new"] if t not in stop_ids()]
        cache_length += ctx.prompt_len + len(ctx.output_tokens)
        assert ctx.all_seq_len == cache_length
    assert expected["turns"][1]["prompt_len"] == hf_count(hf_render([{"role": "user", "content": TURNS[1]}]))
    probe = np.asarray(model.forward([5])).reshape(-1)
    mnn_probe = np.asarray(expected["probe_logits"], dtype=np.float32)
    assert np.abs(probe - mnn_probe).max() <= 1e-3 * np.abs(mnn_probe).max()


def test_chat_turns_two_and_three_prefill_only_their_new_tokens():
    model = load_model(reuse_kv=True)
    session = ChatSession(model)
    messages: list[dict] = []
    in_cache, cache_length = "", 0
    for turn, text in enumerate(TURNS):
        messages.append({"role": "user", "content": text})
        full = hf_render(messages)
        assert full.startswith(in_cache)
        new_text = full[len(in_cache):]
        if turn:  # the end-of-turn marker after the last reply, then the templated new turn
            assert new_text == "<|im_end|>\n" + hf_render([{"role": "user", "content": text}])
        reply = session.ask(text, max_new_tokens=NEW_TOKENS)
        assert model.context.prompt_len == hf_count(new_text)
        assert reply.cached_tokens == cache_length
        cache_length += model.context.prompt_len + len(reply.token_ids)
        assert model.context.all_seq_len == cache_length  # nothing was prefilled twice
        messages.append({"role": "assistant", "content": reply.text})
        in_cache = full + reply.text


def test_a_reused_cache_gives_the_reply_a_fresh_prefill_of_the_same_ids_gives():
    model = load_model(reuse_kv=True)
    session = ChatSession(model)
    session.ask(TURNS[0], max_new_tokens=NEW_TOKENS)
    second = session.ask(TURNS[1], max_new_tokens=NEW_TOKENS)
    fed = model.context.history_tokens[: model.context.all_seq_len - len(second.token_ids)]
    model.reset()
    assert model.generate(fed, NEW_TOKENS) == second.token_ids


def test_without_reuse_kv_every_turn_prefills_the_whole_conversation():
    model = load_model(reuse_kv=False)
    session = ChatSession(model)
    first = session.ask(TURNS[0], max_new_tokens=NEW_TOKENS)
    second = session.ask(TURNS[1], max_new_tokens=NEW_TOKENS)
    conversation = [{"role": "user", "content": TURNS[0]}, {"role": "assistant", "content": first.text},
                    {"role": "user", "content": TURNS[1]}]
    assert model.context.prompt_len == hf_count(hf_render(conversation))
    assert second.cached_tokens == 0


def test_a_prompt_that_does_not_extend_the_cache_is_prefilled_whole():
    model = load_model(reuse_kv=True)
    cache = PromptCache(model)
    first = generate_reply(model, cache, CHAT_PROMPT, NEW_TOKENS)
    other = hf_render([{"role": "user", "content": "Something else entirely"}])
    second = generate_reply(model, cache, other, NEW_TOKENS)
    assert (second.cached_tokens, model.context.prompt_len) == (0, hf_count(other))
    assert model.context.all_seq_len == hf_count(other) + len(second.token_ids)
    assert first.token_ids == greedy_reply(CHAT_PROMPT, NEW_TOKENS)[0]


def test_reset_forgets_the_conversation():
    model = load_model(reuse_kv=True)
    session = ChatSession(model, system_prompt="Be brief.")
    first = session.ask(CHAT_QUESTION, max_new_tokens=NEW_TOKENS)
    session.reset()
    again = session.ask(CHAT_QUESTION, max_new_tokens=NEW_TOKENS)
    assert again.token_ids == first.token_ids and again.cached_tokens == 0
    system_turn = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": CHAT_QUESTION}]
    assert model.context.prompt_len == hf_count(hf_render(system_turn))


# ---- the command ------------------------------------------------------------------------------------


def chat_command(*extra: str) -> list[str]:
    return [sys.executable, "-m", "mnngpu", "chat", str(MODEL_DIR), *CLI_ORACLE_FLAGS, "--sampler", "greedy", *extra]


def replies(stdout: str) -> list[str]:
    return [part.split("\n\nUser: ")[0].rstrip("\n") for part in stdout.split("\nA: ")[1:]]


def test_chat_command_answers_each_turn_and_resets():
    """Piped (stdin no terminal): stdout holds the replies alone, with no `User: ` prompt among
    them, and what /reset says goes to stderr, not under the reply's `A: ` label."""
    lines = f"{CHAT_QUESTION}\n/reset\n{CHAT_QUESTION}\n/exit\n"
    done = subprocess.run(chat_command("-n", "8"), input=lines, capture_output=True, text=True, timeout=120,
                          errors="replace", check=False)
    assert done.returncode == 0, done.stderr
    expected = greedy_reply(CHAT_PROMPT, 8)[1]
    assert replies(done.stdout) == [expected, expected]
    assert done.stdout == f"\nA: {expected}\n\nA: {expected}\n"
    assert "reset done." in done.stderr.splitlines()
    assert "ready: " + MODEL_DIR.name in done.stderr


class _Session:
    def __init__(self):
        self.resets = 0

    def reset(self):
        self.resets += 1


def test_a_command_answers_on_stderr_without_the_replys_label():
    """chat_loop as a terminal runs it: the prompt before each line; /reset's answer on stderr."""
    from mnngpu.apps.commands.chat import USER_PROMPT, chat_loop

    out, err, prompts = io.StringIO(), io.StringIO(), []
    lines = iter(["/reset", "/exit"])
    session = _Session()

    def read_line(prompt: str) -> str:
        prompts.append(prompt)
        return next(lines)

    assert chat_loop(session, read_line, out, err) == 0
    assert session.resets == 1 and prompts == [USER_PROMPT, USER_PROMPT] == ["\nUser: "] * 2
    assert out.getvalue() == "" and err.getvalue() == "reset done.\n"


def test_ctrl_c_stops_the_reply_not_the_program():
    command = chat_command("-n", "20000", "--config", "max_all_tokens=30000")
    chat = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        chat.stdin.write(b"hello\n")
        chat.stdin.flush()
        seen = b""
        while not seen.endswith(b"\nA: "):  # the reply is armed for Ctrl-C before this is written
            seen += os.read(chat.stdout.fileno(), 1)
        seen += os.read(chat.stdout.fileno(), 1)  # and generation has begun
        chat.send_signal(signal.SIGINT)
        chat.stdin.write(b"/exit\n")
        chat.stdin.close()
        seen += chat.stdout.read()
        assert chat.wait(timeout=120) == 0
    finally:
        chat.kill()
        chat.wait()
    assert b" [stopped]\n" in seen


# ---- chat as a terminal program (a pty, as a user types) ---------------------------------------------------------

UP, LEFT = "\x1b[A", "\x1b[D"


def spawn_chat(*extra: str, env: dict | None = None):
    pexpect = pytest.importorskip("pexpect")
    command = chat_command(*extra)
    chat = pexpect.spawn(command[0], command[1:], encoding="utf-8", codec_errors="replace", timeout=120, env=env)
    chat.expect("User: ")
    return chat


def finish(chat) -> int:
    import pexpect

    chat.expect(pexpect.EOF)
    chat.close()
    return chat.exitstatus


def test_help_lists_the_commands_and_an_unknown_one_never_reaches_the_model():
    chat = spawn_chat("-n", "4")
    try:
        chat.sendline("/help")
        chat.expect("User: ")
        assert all(name in chat.before for name in ("/help", "/reset", "/exit"))
        chat.sendline("/resett")
        chat.expect("User: ")
        assert "error: unknown command /resett" in chat.before and "A: " not in chat.before
        chat.sendline("/exit")
        assert finish(chat) == 0
    finally:
        chat.close(force=True)


def test_lines_are_edited_and_recalled_with_the_arrow_keys():
    chat = spawn_chat("-n", "4")
    try:
        chat.sendline("/help")
        chat.expect("User: ")
        chat.send(UP + "\r")  # the last line again
        chat.expect("User: ")
        assert "/reset" in chat.before
        chat.send(f"/eit{LEFT}{LEFT}x\r")  # "/exit", with the x put in place
        assert finish(chat) == 0
    finally:
        chat.close(force=True)


def test_ctrl_c_stops_the_first_reply_while_kernels_compile_and_the_chat_goes_on(tmp_path):
    cold = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")}  # nothing compiled yet
    chat = spawn_chat("-n", "64", env=cold)
    try:
        chat.sendline(CHAT_QUESTION)
        chat.expect("A: ")
        chat.sendintr()
        chat.expect(r"\[stopped\]")
        chat.expect("User: ")
        chat.sendline("/exit")
        assert finish(chat) == 0
    finally:
        chat.close(force=True)


def test_a_conversation_that_outgrows_the_context_drops_its_oldest_turns_and_goes_on():
    too_long = "word " * 80  # alone more than max_all_tokens: an error for that turn, not for the chat
    lines = "".join(f"{text}\n" for text in [*TURNS, too_long, TURNS[0]]) + "/exit\n"
    done = subprocess.run(chat_command("-n", "8", "--config", "max_all_tokens=64"), input=lines,
                          capture_output=True, text=True, timeout=120, errors="replace", check=False)
    assert done.returncode == 0, done.stderr
    assert len(replies(done.stdout)) == len(TURNS) + 2
    notes = [line for line in done.stderr.splitlines() if line.startswith("note: ")]
    assert notes and all("outgrew max_all_tokens=64" in note for note in notes)
    assert any(line.startswith("error: ") and "max_all_tokens" in line for line in done.stderr.splitlines())


def test_dropping_turns_keeps_the_newest_ones_that_fit():
    model = load_model(reuse_kv=True, max_all_tokens=96)
    session = ChatSession(model)
    for text in TURNS[:2]:
        session.ask(text, max_new_tokens=8)
    before = list(session.messages)
    dropped = session.make_room(TURNS[2], max_new_tokens=8)
    assert dropped >= 1 and len(session.messages) == len(before) - 2 * dropped
    assert session.messages == before[2 * dropped:]  # the newest turns, whole
    prompt = hf_render([*session.messages, {"role": "user", "content": TURNS[2]}])
    assert hf_count(prompt) + min(8, 96 // 4) <= 96
    reply = session.ask(TURNS[2], max_new_tokens=8)
    assert model.context.prompt_len == hf_count(prompt) and reply.cached_tokens == 0
