"""The chat page at / of `mnngpu serve`, in a real headless Chromium (the system's `chromium`, driven
through its `chromedriver` by selenium), over `mnngpu serve` on the demo model.

Truths: the server's own API, asked through the `openai` client for the same request (the greedy
reply, the error message); Python's `re` for where <think> blocks split a reply; the browser's own
record of what it loaded (performance entries) and of what its security policy refused.
"""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import pytest

pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx")

from tests.conftest import skip_unavailable, unavailable_backend
from tests.serving import WAIT_S, ServeProcess
from tools.screenshot_chat_page import CHROMEDRIVER, CHROMIUM, headless_chromium

STORY = "Tell me a story about a fox."
CROW = "What colour is a crow?"
# the demo tokenizer's special tokens (docs/demo_model.md); a reply that may sample none of them runs on
# to max_tokens
SPECIALS = "<|endoftext|><|im_start|><|im_end|>"


def chromium_or_skip() -> None:
    missing = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not path.exists()]
    if missing:
        skip_unavailable("chromium", f"{', '.join(missing)} missing (apt-get install chromium chromium-driver)")
    try:
        import selenium  # noqa: F401
    except ImportError:
        skip_unavailable("chromium", "the selenium package is missing (pip install -e '.[test]')")


@pytest.fixture(scope="module")
def server():
    from mnngpu.demo import DEMO_MODEL_DIR

    chromium_or_skip()
    # room for a reply long enough to be stopped by hand (the demo's own max_all_tokens is 2048, under a second)
    process = ServeProcess("--config", "max_all_tokens=16384", "--quiet", model_dir=DEMO_MODEL_DIR)
    try:
        yield process
    finally:
        process.signal(signal.SIGINT)
        try:
            process.finish()
        finally:
            process.kill()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=WAIT_S) as client:
        yield client


@pytest.fixture(scope="module")
def browser(server, tmp_path_factory):
    driver = headless_chromium(tmp_path_factory.mktemp("chromium-profile"))
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def page(browser, http):
    """The page, freshly loaded with no saved settings, once it has found the model."""
    browser.get(f"{http.base_url}/")
    browser.execute_script("localStorage.clear()")
    browser.refresh()
    model = http.get("/v1/models").json()["data"][0]["id"]
    wait_for(browser, lambda d: by_id(d, "model").text == model)
    return browser


def by_id(driver, name: str):
    from selenium.webdriver.common.by import By

    return driver.find_element(By.ID, name)


def type_into(driver, name: str, text: str) -> None:
    field = by_id(driver, name)
    field.clear()
    field.send_keys(text)


def wait_for(driver, condition, timeout: float = WAIT_S):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(condition)


def assistant_replies(driver) -> list[dict]:
    """Each assistant reply on the page: its state and the text of its answer and its thinking."""
    return driver.execute_script("""
        return [...document.querySelectorAll('.message.assistant')].map((box) => ({
            state: box.dataset.state, answer: box.querySelector('.content').textContent,
            thinking: box.querySelector('.thinking-text').textContent}));""")


def send(driver, prompt: str) -> dict | None:
    """Type and send `prompt`; once the page is idle again, the reply it shows (None if none)."""
    count = len(driver.find_elements("css selector", ".message.user"))
    type_into(driver, "prompt", prompt)
    by_id(driver, "send").click()
    wait_for(driver, lambda d: len(d.find_elements("css selector", ".message.user")) > count
             and d.execute_script("return state.controller === null"))
    replies = assistant_replies(driver)
    return replies[-1] if len(replies) > count else None


def api_reply(server, messages: list[dict], **fields) -> str:
    response = server.api.chat.completions.create(model="model", messages=messages, **fields)
    return response.choices[0].message.content


def watch_reply_lengths(driver) -> None:
    """Record the length of the newest reply's answer at each change the page makes (window.lengths)."""
    driver.execute_script("""
        window.lengths = [];
        new MutationObserver(() => {
            const boxes = document.querySelectorAll('.message.assistant .content');
            if (boxes.length) window.lengths.push(boxes[boxes.length - 1].textContent.length);
        }).observe(document.getElementById('messages'), {subtree: true, childList: true, characterData: true});""")


# ---- chatting ---------------------------------------------------------------------------------------------

def test_the_streamed_reply_is_the_apis_greedy_reply_turn_after_turn(page, server):
    system = "You are a friendly storyteller."
    type_into(page, "system", system)
    type_into(page, "temperature", "0")
    type_into(page, "max_tokens", "48")
    watch_reply_lengths(page)
    first = send(page, STORY)
    messages = [{"role": "system", "content": system}, {"role": "user", "content": STORY}]
    expected = api_reply(server, messages, temperature=0, max_tokens=48)
    assert first == {"state": "done", "answer": expected, "thinking": ""} and len(expected) > 40
    # text is only ever added (how much at a time depends on how the pieces arrive; that a reply shows
    # while it streams, the stop test sees)
    lengths = page.execute_script("return window.lengths")
    assert lengths == sorted(lengths) and lengths[-1] == len(expected), lengths

    second = send(page, CROW)   # the conversation so far goes with it
    messages += [{"role": "assistant", "content": expected}, {"role": "user", "content": CROW}]
    assert second["answer"] == api_reply(server, messages, temperature=0, max_tokens=48) != ""
    assert by_id(page, "stop").get_attribute("disabled") and by_id(page, "send").is_enabled()


def test_a_new_chat_clears_the_conversation(page, server):
    type_into(page, "max_tokens", "32")
    send(page, STORY)
    by_id(page, "new-chat").click()
    assert assistant_replies(page) == [] and page.execute_script("return state.history") == []
    reply = send(page, CROW)
    assert reply["answer"] == api_reply(server, [{"role": "user", "content": CROW}], max_tokens=32)
    assert len(assistant_replies(page)) == 1


def test_enter_sends_and_the_settings_are_kept_for_the_next_visit(page, server):
    from selenium.webdriver.common.keys import Keys

    type_into(page, "max_tokens", "16")
    type_into(page, "prompt", CROW + Keys.ENTER)
    wait_for(page, lambda d: [r["state"] for r in assistant_replies(d)] == ["done"])
    assert assistant_replies(page)[0]["answer"] == api_reply(server, [{"role": "user", "content": CROW}],
                                                             max_tokens=16)
    page.refresh()
    assert by_id(page, "max_tokens").get_attribute("value") == "16" and assistant_replies(page) == []


def test_stop_ends_a_long_reply_and_the_server_stays_healthy(page, server, http):
    banned = http.post("/tokenize", json={"prompt": SPECIALS}).json()["tokens"]
    assert len(banned) == 3
    type_into(page, "max_tokens", "12000")
    by_id(page, "extra").send_keys(json.dumps({"logit_bias": {str(token): -100 for token in banned}}))
    type_into(page, "prompt", STORY)
    by_id(page, "send").click()
    wait_for(page, lambda d: len(assistant_replies(d)) == 1 and len(assistant_replies(d)[0]["answer"]) > 300)
    # shown as it streams: the reply is on the page while its request is still going
    assert assistant_replies(page)[0]["state"] == "streaming"
    assert by_id(page, "send").get_attribute("disabled") and by_id(page, "stop").is_enabled()
    by_id(page, "stop").click()
    wait_for(page, lambda d: assistant_replies(d)[0]["state"] == "stopped")
    assert by_id(page, "stop").get_attribute("disabled") and by_id(page, "send").is_enabled()
    stopped = assistant_replies(page)[0]["answer"]
    wait_for(http, lambda client: running(client) == 0.0, timeout=30)   # the server's generation ended too
    time.sleep(1.0)
    assert assistant_replies(page)[0]["answer"] == stopped   # no more text came
    assert len(stopped) < 12000   # far from the reply it would have been
    assert http.get("/health").json() == {"status": "ok"}
    assert api_reply(server, [{"role": "user", "content": CROW}], max_tokens=16) != ""
    # the stopped reply stays in the conversation
    assert page.execute_script("return state.history.map((m) => m.role)") == ["user", "assistant"]

    # a new chat in the middle of a reply stops it, and none of it lands in the new conversation
    type_into(page, "prompt", CROW)
    by_id(page, "send").click()
    wait_for(page, lambda d: len(assistant_replies(d)) == 2 and len(assistant_replies(d)[1]["answer"]) > 100)
    by_id(page, "new-chat").click()
    wait_for(page, lambda d: d.execute_script("return state.controller === null"))
    assert assistant_replies(page) == [] and page.execute_script("return state.history") == []
    wait_for(http, lambda client: running(client) == 0.0, timeout=30)


def running(client) -> float:
    return float(re.search(r"^mnngpu_requests_running (\S+)$", client.get("/metrics").text, re.MULTILINE).group(1))


# ---- errors and images ------------------------------------------------------------------------------------

def error_texts(driver) -> list[str]:
    return driver.execute_script("return [...document.querySelectorAll('.error')].map((e) => e.textContent)")


def test_an_error_from_the_api_is_shown_in_the_page(page, server, http):
    type_into(page, "top_p", "1.5")
    send(page, CROW)
    body = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": CROW}], "top_p": 1.5,
                                                   "stream": True}).json()
    assert error_texts(page) == [f"400: {body['error']['message']} ({body['error']['param']})"]
    assert assistant_replies(page) == []


def test_settings_the_page_cannot_read_are_refused_before_sending(page):
    by_id(page, "extra").send_keys("{not json")
    type_into(page, "prompt", CROW)
    by_id(page, "send").click()
    wait_for(page, lambda d: error_texts(d))
    assert error_texts(page)[0].startswith("Other request fields: not valid JSON")
    assert assistant_replies(page) == [] and page.execute_script("return state.history") == []


def test_an_image_goes_to_the_server_as_a_data_url_part(page, server, http, tmp_path):
    """The demo model reads no images, so the server refuses the part, which proves it got one."""
    from PIL import Image

    path = tmp_path / "red.png"
    Image.new("RGB", (8, 8), (255, 0, 0)).save(path)
    by_id(page, "image-input").send_keys(str(path))
    wait_for(page, lambda d: d.execute_script("return state.images.length") == 1)
    url = page.execute_script("return state.images[0]")
    assert url.startswith("data:image/png;base64,")
    send(page, "What is in this picture?")
    shown = page.execute_script("return [...document.querySelectorAll('.message.user img')].map((i) => i.src)")
    assert shown == [url]
    content = [{"type": "text", "text": "What is in this picture?"}, {"type": "image_url", "image_url": {"url": url}}]
    body = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": content}]}).json()
    assert "reads no images" in body["error"]["message"]
    assert error_texts(page) == [f"400: {body['error']['message']} ({body['error']['param']})"]


# ---- what the page renders: text as text, thinking apart ---------------------------------------------------

HOSTILE = '<img src=x onerror="window.injected = 1"><b>bold</b> & <script>window.injected = 2</script>'


def test_every_text_is_shown_as_text_never_as_html(page):
    """The user's own text, and model text (a reply view fed a delta directly)."""
    type_into(page, "max_tokens", "8")
    send(page, HOSTILE)
    page.execute_script("const view = new ReplyView(); view.add({content: arguments[0]}); view.end('done');",
                        HOSTILE)
    texts = page.execute_script("return [...document.querySelectorAll('.message .content')]"
                                ".map((c) => c.textContent)")
    assert texts[0] == HOSTILE and texts[-1] == HOSTILE
    assert page.execute_script("return document.querySelectorAll('#messages b, #messages script').length") == 0
    assert page.execute_script("return window.injected") is None


THOUGHTFUL = "<think>\nThe user asks about crows.\n</think>\n\nThe colour of a crow is black."


def think_split(text: str) -> tuple[str, str]:
    """(thinking, answer) of a reply that opens with its thinking (the opening tag maybe left in the
    prompt by the template), as the page should show them: the answer without the blank lines before it."""
    match = re.fullmatch(r"(?s)(?:<think>)?(.*?)</think>\s*(.*)", text)
    return (match.group(1), match.group(2)) if match else ("", text)


def shown(page, deltas: list[dict]) -> dict:
    return page.execute_script("""
        const view = new ReplyView();
        for (const delta of arguments[0]) view.add(delta);
        view.end('done');
        const details = view.box.querySelector('details.thinking');
        return {answer: view.answer, thinking: details.querySelector('.thinking-text').textContent,
                visible: !details.hidden, open: details.open};""", deltas)


@pytest.mark.parametrize("text", [THOUGHTFUL, THOUGHTFUL.removeprefix("<think>"), "no thinking < here </thin",
                                  "<think></think>Plain."])
def test_a_think_block_in_the_content_is_shown_apart_however_the_stream_cuts_it(page, text):
    thinking, answer = think_split(text)
    for cut in range(len(text) + 1):
        deltas = [{"content": text[:cut]}, {"content": text[cut:]}]
        assert shown(page, deltas) == {"answer": answer, "thinking": thinking, "visible": bool(thinking.strip()),
                                       "open": not (answer and thinking.strip())}, cut
    assert shown(page, [{"content": char} for char in text])["answer"] == answer


def test_reasoning_content_is_shown_apart_dimmed_and_collapsible(page):
    deltas = [{"reasoning_content": "The user asks "}, {"reasoning_content": "about crows."},
              {"content": "Black."}]
    assert shown(page, deltas) == {"answer": "Black.", "thinking": "The user asks about crows.", "visible": True,
                                   "open": False}
    style = page.execute_script("""
        const block = document.querySelector('.message.assistant details.thinking');
        const answer = block.parentElement.querySelector('.content');
        return [getComputedStyle(block).color, getComputedStyle(answer).color];""")
    assert style[0] != style[1]   # dimmed: drawn in another colour than the answer
    opened = page.execute_script("""
        const view = new ReplyView();
        view.add({reasoning_content: 'Hmm.'});
        const thinking = view.thinking.open;
        view.add({content: 'Black.'});
        return [thinking, view.thinking.open, view.box.dataset.state];""")
    assert opened == [True, False, "streaming"]   # open while it thinks, folded as the answer starts


# ---- nothing from another site ------------------------------------------------------------------------------

def test_the_page_loads_nothing_from_another_origin(page, server, http):
    response = http.get("/")
    assert response.headers["content-type"].startswith("text/html")
    assert re.findall(r"(?i)\b(?:https?:)?//[\w.-]+", response.text) == []   # no absolute or protocol-relative URL
    policy = response.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "connect-src 'self'" in policy

    send(page, CROW)
    origin = f"http://127.0.0.1:{server.port}"
    loaded = page.execute_script("return performance.getEntries().map((e) => e.name)")
    assert any(name.startswith(f"{origin}/v1/chat/completions") for name in loaded), loaded
    assert [name for name in loaded if name.startswith(("http:", "https:")) and not name.startswith(origin + "/")
            ] == []


def test_the_browser_refuses_a_request_to_another_origin(page):
    """The page's Content-Security-Policy holds in the browser: a fetch elsewhere never leaves it."""
    outcome = page.execute_async_script("""
        const done = arguments[arguments.length - 1];
        const refused = [];
        document.addEventListener('securitypolicyviolation', (e) => refused.push(e.blockedURI));
        fetch('http://127.0.0.2:9/elsewhere').then(() => done(['fetched', refused]),
            (error) => setTimeout(() => done([String(error), refused]), 100));""")
    assert outcome[0].startswith("TypeError") and outcome[1] == ["http://127.0.0.2:9/elsewhere"]


# ---- the skip CI turns into a failure -------------------------------------------------------------------------

def test_mnngpu_require_chromium_catches_this_modules_skips(monkeypatch):
    monkeypatch.setenv("MNNGPU_REQUIRE", "opencl,vulkan,chromium")
    assert unavailable_backend("chromium unavailable: /usr/bin/chromium missing") == "chromium"
    assert unavailable_backend("could not import 'selenium': No module named 'selenium'") == "chromium"
    monkeypatch.setenv("MNNGPU_REQUIRE", "opencl,vulkan")
    assert unavailable_backend("chromium unavailable: /usr/bin/chromium missing") is None


def test_the_page_ships_as_package_data():
    import tomllib

    root = Path(__file__).resolve().parents[1]
    data = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    page_dir = root / "mnngpu" / "apps" / "server" / "page"
    shipped = {path.name for pattern in data["mnngpu.apps.server.page"] for path in page_dir.glob(pattern)}
    assert shipped == {path.name for path in page_dir.iterdir() if path.suffix != ".py" and path.is_file()}
