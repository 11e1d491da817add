// A contributor's draft (#/draft): started from the current version, kept in this browser (localStorage),
// edited experience by experience (the node gives each its canonical document: /app/draft/experience),
// built into canonical bytes with their root and CID (/app/draft/build, checked again here), proposed
// through the wallet, then published to the node's IPFS (/app/publish), which takes only what a
// proposal on chain names.

import { parseEventLogs } from "viem";
import { proposalId } from "./chain.js";
import { h, replace, short } from "./dom.js";
import { diff, readLibrary } from "./library.js";
import { effectForm, experience, fetchBytes } from "./views.js";

const KEY = "zoo-draft";

function load() {
  try {
    return JSON.parse(localStorage.getItem(KEY));
  } catch {
    return null;
  }
}

function save(draft) {
  localStorage.setItem(KEY, JSON.stringify(draft));
}

async function post(path, body) {
  const r = await fetch(path, { method: "POST", headers: { "content-type": "application/json" }, body: typeof body === "string" ? body : JSON.stringify(body) });
  const answer = await r.json().catch(() => ({ error: { message: `HTTP ${r.status}` } }));
  if (!r.ok) throw new Error(answer.error?.message ?? `HTTP ${r.status}`);
  return answer;
}

async function start(chain) {
  const [version, root, , cid] = await chain.read("currentLibrary");
  const read = readLibrary(await fetchBytes(cid));
  if (!read.library || read.root !== root || read.problems.length) throw new Error(`version ${version}'s content does not match its root`);
  const lib = read.library;
  const draft = {
    parentVersion: version.toString(),
    parent: lib,
    library: { version: Number(version) + 1, parent_root: root, base_model: lib.base_model, description: lib.description, experiences: lib.experiences, ...(lib.base_model_sha256 ? { base_model_sha256: lib.base_model_sha256 } : {}) },
    built: null,
  };
  save(draft);
  return draft;
}

function editor(values, onSave, label) {
  const kind = values.kind ?? "lesson";
  const text = h("textarea", { name: "text", rows: 2, cols: 90, placeholder: kind === "example" ? "The question" : "When …, … (the rule, opening with its trigger)" });
  text.value = values.text ?? "";
  const domain = h("input", { name: "domain", size: 24, placeholder: "math.geometry", value: values.domain ?? "" });
  const confidence = h("input", { name: "confidence", size: 6, value: values.confidence ? String(Number(values.confidence)) : "0.8" });
  const answer = kind === "example" ? h("input", { name: "answer", size: 40, placeholder: "The short correct answer", value: values.answer ?? "" }) : null;
  return h(
    "form",
    {
      class: "editor",
      onsubmit: (e) => {
        e.preventDefault();
        onSave({ kind, text: text.value, domain: domain.value.trim(), confidence: Number(confidence.value), ...(answer ? { answer: answer.value, reasoning: values.reasoning ?? null } : {}) });
      },
    },
    text,
    h("div", {}, "domain ", domain, " confidence ", confidence, answer ? [" answer ", answer] : null, " ", h("button", { type: "submit" }, label)),
  );
}

export async function draftPage(main, chain, say) {
  if (!chain.account) {
    replace(main, h("h1", {}, "Draft"), h("p", {}, "Connect a wallet to draft a library version: its experiences name you as their author, and it proposes the draft."));
    return;
  }
  let draft = load();
  const current = await chain.read("currentVersion");
  if (draft && BigInt(draft.parentVersion) !== current) {
    say(`The draft built on version ${draft.parentVersion}; version ${current} is current now. Start again from it.`, "error");
    localStorage.removeItem(KEY);
    draft = null;
  }
  if (!draft) {
    replace(main, h("h1", {}, "Draft"), h("p", {}, `No draft in this browser.`), h("button", { id: "start-draft", onclick: async () => { await start(chain); await draftPage(main, chain, say); } }, `Start from version ${current}`));
    return;
  }
  const lib = draft.library;
  const redraw = () => draftPage(main, chain, say);
  const change = diff(draft.parent, lib);
  const make = async (values, replacing) => {
    try {
      const doc = await post("/app/draft/experience", { ...values, author: chain.account, base_model: lib.base_model });
      lib.experiences = lib.experiences.filter((e) => e.id !== replacing && e.id !== doc.id).concat([doc]);
      draft.built = null;
      save(draft);
      say(`${replacing ? "Edited" : "Added"} ${doc.id}.`, "ok");
    } catch (e) {
      say(`Not taken: ${e.message}`, "error");
    }
    await redraw();
  };
  const items = lib.experiences.map((e) => {
    const li = experience(e);
    li.append(
      h("button", { class: "edit", onclick: () => li.append(editor(e, (v) => make(v, e.id), "Save")) }, "Edit"),
      h("button", {
        class: "remove",
        onclick: async () => {
          lib.experiences = lib.experiences.filter((x) => x.id !== e.id);
          draft.built = null;
          save(draft);
          say(`Removed ${e.id}.`, "ok");
          await redraw();
        },
      }, "Remove"),
    );
    return li;
  });
  const built = draft.built;
  replace(
    main,
    h("h1", {}, `Draft of version ${lib.version}`),
    h("p", { class: "muted", id: "draft-change" }, `Against version ${draft.parentVersion}: ${change.added.length} added, ${change.removed.length} removed, ${change.edited.length} edited; ${lib.experiences.length} experiences.`),
    h("h2", {}, "Add a lesson"),
    h("div", { id: "add-lesson" }, editor({}, (v) => make(v), "Add lesson")),
    h("h2", {}, "Add a worked example"),
    h("div", { id: "add-example" }, editor({ kind: "example" }, (v) => make(v), "Add example")),
    h("h2", {}, "Propose"),
    draft.proposed
      ? h("div", { id: "proposed" }, h("p", {}, `Proposed as ${draft.proposed}; its bytes are not published yet.`), h("button", { id: "publish", onclick: () => publish(draft, say) }, "Publish"))
      : built
      ? h(
          "div",
          { id: "built" },
          h("dl", {}, [["root", built.root], ["experiences", String(built.size)], ["CID", built.cid]].map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])),
          h("button", { id: "propose", onclick: () => propose(chain, draft, say) }, "Propose (the wallet signs)"),
          h("h2", {}, "Measured effect"),
          (chain.config.tasks ?? []).length
            ? effectForm(chain.config.tasks, { draft: built.document }, [`A: version ${draft.parentVersion}`, "B: this draft"])
            : h("p", { class: "muted" }, "This node serves no model, so it measures no effects (a full node's web app does)."),
        )
      : h("button", {
          id: "build",
          onclick: async () => {
            try {
              const answer = await post("/app/draft/build", lib);
              const read = readLibrary(new TextEncoder().encode(answer.document));
              if (read.root !== answer.root || read.problems.length) throw new Error(`the node's build does not check here: ${read.problems.join("; ") || `root ${read.root}`}`);
              draft.built = answer;
              save(draft);
              say(`Built: root ${short(answer.root, 18)}, ${answer.size} experiences.`, "ok");
            } catch (e) {
              say(`Not built: ${e.message}`, "error");
            }
            await redraw();
          },
        }, "Build"),
    h("button", { id: "discard", onclick: async () => { localStorage.removeItem(KEY); say("Draft discarded."); await redraw(); } }, "Discard draft"),
    h("h2", {}, "Experiences"),
    h("ul", { class: "experiences", id: "draft-experiences" }, items),
  );
}

// Propose through the wallet, then publish. A proposal mined is recorded in the draft at once, so a failed
// publish is retried on its own (never a second proposal).
async function propose(chain, draft, say) {
  const built = draft.built;
  const salt = `0x${[...crypto.getRandomValues(new Uint8Array(32))].map((b) => b.toString(16).padStart(2, "0")).join("")}`;
  say("propose: waiting for the wallet to sign and the chain to include it …");
  try {
    const receipt = await chain.send("propose", [built.root, BigInt(built.size), built.cid, BigInt(draft.parentVersion), salt]);
    const [created] = parseEventLogs({ abi: chain.abi.ExperienceRegistry, eventName: "ProposalCreated", logs: receipt.logs });
    if (!created) throw new Error(`the transaction ${receipt.transactionHash} made no proposal`);
    draft.proposed = proposalId(created.args.proposalId);
    save(draft);
  } catch (e) {
    say(`propose failed: ${e.shortMessage ?? e.message}`, "error");
    return;
  }
  await publish(draft, say);
}

async function publish(draft, say) {
  try {
    await post("/app/publish", draft.built.document);
  } catch (e) {
    say(`Proposed as ${draft.proposed}, but the node did not publish its bytes: ${e.message}. Publish again.`, "error");
    window.dispatchEvent(new HashChangeEvent("hashchange"));
    return;
  }
  localStorage.removeItem(KEY);
  say(`Proposed and published: proposal ${draft.proposed}.`, "ok");
  window.location.hash = `#/proposal/${draft.proposed}`;
}
