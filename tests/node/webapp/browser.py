"""Test helpers: Debian's chromium driven by Playwright, and a test wallet in it.

The test wallet is an EIP-1193 provider (`window.ethereum`) injected into every page before the app's own
scripts, as a browser extension's is. It forwards each request to the devnet's anvil, whose dev accounts
are unlocked there, so anvil signs; like a real wallet it runs outside the page (a Playwright binding), so
the page's Content-Security-Policy does not apply to it and the page never sees a key. `use(account)`
switches accounts and tells the page (`accountsChanged`), as a wallet does.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Headless, and none of chromium's background calls out (this machine's network is closed to them).
CHROMIUM_ARGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
ARTIFACTS = Path(__file__).resolve().parents[3] / "tests" / ".artifacts" / "webapp"

PROVIDER = """
(() => {
  const listeners = {};
  window.ethereum = {
    isZooDevWallet: true,
    async request({ method, params }) {
      const answer = JSON.parse(await window.zooDevWallet(JSON.stringify({ method, params: params ?? [] })));
      if (answer.error) { const e = new Error(answer.error.message); e.code = answer.error.code; throw e; }
      return answer.result;
    },
    on(event, fn) { (listeners[event] ??= []).push(fn); },
    removeListener(event, fn) { listeners[event] = (listeners[event] ?? []).filter((f) => f !== fn); },
    _emit(event, value) { for (const fn of listeners[event] ?? []) fn(value); },
  };
})();
"""


class DevWallet:
    """The wallet's side: which dev account it holds, and anvil behind it."""

    def __init__(self, rpc_url: str, account: str) -> None:
        self.rpc_url, self.account = rpc_url, account
        self.sent: list[str] = []  # methods the page asked the wallet to run
        self.allowed = False  # whether the page asked for an account (eth_accounts is empty until then)

    def answer(self, raw: str) -> str:
        request = json.loads(raw)
        method, params = request["method"], request["params"]
        self.sent.append(method)
        if method == "eth_requestAccounts":
            self.allowed = True
        if method in ("eth_requestAccounts", "eth_accounts"):
            return json.dumps({"result": [self.account] if self.allowed else []})
        if (
            method == "eth_sendTransaction"
            and params
            and params[0].get("from", "").lower() != self.account.lower()
        ):
            return json.dumps({"error": {"code": 4100, "message": "not this wallet's account"}})
        r = httpx.post(
            self.rpc_url, json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params}, timeout=60
        )
        return json.dumps(r.json())

    def use(self, page: Any, account: str) -> None:
        self.account = account
        page.evaluate("(a) => window.ethereum._emit('accountsChanged', [a])", account)


@contextlib.contextmanager
def browser_page(base_url: str, wallet: DevWallet | None = None) -> Iterator[Any]:
    """A page of a fresh headless chromium at `base_url`, with `wallet` injected; console errors and CSP
    violations are collected on page.problems."""
    if not Path(CHROMIUM).exists():
        pytest.fail(
            f"no chromium at {CHROMIUM}: ./zoo setup installs Debian's package (apt-get install chromium)"
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.problems = []
            page.on("console", lambda m: m.type == "error" and page.problems.append(m.text))
            page.on("pageerror", lambda e: page.problems.append(str(e)))
            page.on("response", lambda r: r.status >= 400 and page.problems.append(f"{r.status} {r.url}"))
            if wallet is not None:
                page.expose_function("zooDevWallet", wallet.answer)
                page.add_init_script(PROVIDER)
            page.goto(base_url + "/")
            page.wait_for_selector("body[data-ready]", timeout=30_000)
            yield page
        finally:
            browser.close()


def screenshot(page: Any, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
