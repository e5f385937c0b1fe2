"""Take docs/chat_page.png: the chat page of `mnngpu serve` on the demo model, in a real chat, shot by
headless Chromium (Debian's `chromium` and `chromium-driver`, driven by selenium).

    python -m tools.screenshot_chat_page [--out docs/chat_page.png]

`headless_chromium` is also how tests/test_chat_page.py starts the browser.
"""

from __future__ import annotations

import argparse
import io
import re
import subprocess
import sys
import tempfile
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
# Without these, Chromium as root on a machine with no network waits on the sandbox, its update and
# sync services and the first-run screens, and hangs.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage"]
ROOT = Path(__file__).resolve().parents[1]
WAIT_S = 120
CONVERSATION = ["What colour is a crow?", "Tell me a story about a fox."]


def headless_chromium(user_data_dir: Path, width: int = 1100, height: int = 760):
    """A selenium driver of the system's Chromium, with a fresh profile in `user_data_dir`."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in [*CHROMIUM_FLAGS, f"--user-data-dir={user_data_dir}", f"--window-size={width},{height}"]:
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)


def serve_demo() -> tuple[subprocess.Popen, str]:
    """`mnngpu serve` on the demo model on a free port, and the page's URL once it is up."""
    process = subprocess.Popen([sys.executable, "-m", "mnngpu", "serve", "--port", "0", "--quiet"],
                               stderr=subprocess.PIPE, text=True, cwd=ROOT)
    for line in process.stderr:
        if match := re.search(r"on (http://[\d.]+:\d+)/v1 ", line):
            return process, match.group(1) + "/"
    raise SystemExit(f"mnngpu serve ended with {process.wait()} before it served")


def chat(driver, url: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(url)
    wait = WebDriverWait(driver, WAIT_S)
    wait.until(lambda d: d.find_element(By.ID, "model").text not in ("", "connecting..."))
    driver.find_element(By.ID, "system").send_keys("You are a friendly storyteller.")
    driver.find_element(By.ID, "max_tokens").send_keys("128")
    for number, prompt in enumerate(CONVERSATION, 1):
        driver.find_element(By.ID, "prompt").send_keys(prompt)
        driver.find_element(By.ID, "send").click()
        wait.until(lambda d, turns=number: len(d.find_elements(By.CSS_SELECTOR, ".message.assistant[data-state=done]"))
                   == turns)


def small_png(png: bytes, colours: int = 64) -> bytes:
    """The screenshot with its colours cut to a palette, a fraction of the bytes for a page of flat colours."""
    from PIL import Image

    out = io.BytesIO()
    Image.open(io.BytesIO(png)).convert("RGB").quantize(colours).save(out, format="PNG", optimize=True)
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "chat_page.png")
    args = parser.parse_args()
    process, url = serve_demo()
    try:
        with tempfile.TemporaryDirectory() as profile:
            driver = headless_chromium(Path(profile))
            try:
                chat(driver, url)
                png = small_png(driver.get_screenshot_as_png())
            finally:
                driver.quit()
    finally:
        process.terminate()
        process.wait(WAIT_S)
    args.out.write_bytes(png)
    print(f"{args.out}: {len(png) / 1024:.0f} KB")


if __name__ == "__main__":
    main()
