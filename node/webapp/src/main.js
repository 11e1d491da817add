// The web app's entry: reads the node's config, draws the header (pages and wallet) and routes by the URL's
// hash: #/ proposals, #/proposal/ID one proposal, #/library the current version, #/draft a contributor's
// draft, #/status the node.

import { isAddress } from "viem";
import { Chain } from "./chain.js";
import { h, replace, short } from "./dom.js";
import { draftPage } from "./draft.js";
import { holderBox, libraryPage, proposalPage, proposalsPage, statusPage } from "./views.js";

const main = document.getElementById("main");
const nav = document.getElementById("nav");
const walletBox = document.getElementById("wallet");
const notice = document.getElementById("notice");
let chain = null;
let statusTimer = null;

function say(text, kind = "info") {
  replace(notice, text ? h("p", { class: `notice ${kind}`, id: `notice-${kind}` }, text) : null);
}

async function drawWallet() {
  if (!chain) return;
  if (!chain.account) {
    replace(
      walletBox,
      chain.hasWallet()
        ? h("button", { id: "connect", onclick: () => connect() }, "Connect wallet")
        : h("span", { class: "muted" }, "No wallet in this browser: read-only"),
    );
    return;
  }
  const info = await chain.holder();
  const input = h("input", { id: "delegatee", placeholder: "0x… (empty: yourself)", size: 44 });
  replace(
    walletBox,
    h("span", { id: "account", title: chain.account }, short(chain.account)),
    holderBox(info),
    input,
    h("button", {
      id: "delegate-button",
      onclick: () => {
        const to = input.value.trim() || chain.account;
        if (!isAddress(to)) return say(`${to} is not an address`, "error");
        return act("delegate", () => chain.delegateTo(to));
      },
    }, "Delegate"),
  );
}

async function connect() {
  try {
    await chain.connect();
    say(`Connected ${chain.account}.`);
    await drawWallet();
    await route();
  } catch (e) {
    say(`Could not connect a wallet: ${e.shortMessage ?? e.message}`, "error");
  }
}

// A transaction the wallet signs, said in words while it runs and after.
async function act(what, send) {
  say(`${what}: waiting for the wallet to sign and the chain to include it …`);
  try {
    const receipt = await send();
    say(`${what}: done in block ${receipt.blockNumber}.`, "ok");
  } catch (e) {
    say(`${what} failed: ${e.shortMessage ?? e.message}`, "error");
  }
  await drawWallet();
  await route();
}

const actions = { run: (fn, args) => act(fn, () => chain.send(fn, args)) };

// Each route renders into a view of its own, put in place at once: a slower page still loading (the
// proposals' reads) then writes into a view no longer shown, never over the page the user went to.
async function route() {
  clearInterval(statusTimer);
  const hash = window.location.hash || "#/";
  for (const a of nav.querySelectorAll("a")) a.classList.toggle("here", hash === a.getAttribute("href") || (a.getAttribute("href") === "#/" && hash.startsWith("#/proposal")));
  const view = h("div", { class: "view" });
  replace(main, view);
  try {
    if (hash === "#/status") {
      const refresh = await statusPage(view);
      if (refresh && view.isConnected) statusTimer = setInterval(() => refresh().catch(() => {}), 2000); // still the page shown
      return;
    }
    if (!chain) {
      replace(view, h("h1", {}, "No chain"), h("p", {}, "This node follows no chain: only its status is shown."));
      return;
    }
    const proposal = hash.match(/^#\/proposal\/(0x[0-9a-fA-F]{1,64}|[0-9]{1,78})$/);
    if (proposal) await proposalPage(view, chain, proposal[1], actions);
    else if (hash === "#/library") await libraryPage(view, chain);
    else if (hash === "#/draft") await draftPage(view, chain, say);
    else await proposalsPage(view, chain);
  } catch (e) {
    replace(view, h("h1", {}, "Could not show this page"), h("p", { class: "verdict bad" }, e.shortMessage ?? e.message));
  }
}

async function start() {
  const config = await (await fetch("/app/config.json")).json();
  if (config.chain) chain = new Chain(config);
  replace(
    nav,
    config.chain ? [h("a", { href: "#/" }, "Proposals"), h("a", { href: "#/library" }, "Library"), h("a", { href: "#/draft" }, "Draft")] : null,
    config.status ? h("a", { href: "#/status" }, "Node") : null,
  );
  window.addEventListener("hashchange", route);
  window.ethereum?.on?.("accountsChanged", (accounts) => {
    if (chain) chain.account = accounts[0] ?? null;
    drawWallet().then(route);
  });
  if (chain?.hasWallet()) await chain.connect({ quietly: true }).catch(() => null);
  await drawWallet();
  await route();
  document.body.dataset.ready = "1";
}

start().catch((e) => {
  replace(main, h("h1", {}, "The web app could not start"), h("p", { class: "verdict bad" }, e.message));
});
