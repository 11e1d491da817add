// The pages: proposals, one proposal, the current library, the node's status. Each renders into `main`
// with dom.h (text only) and says in words what it could not read.

import { formatUnits } from "viem";
import { duration, h, replace, short, when } from "./dom.js";
import { proposalId } from "./chain.js";
import { diff, readLibrary } from "./library.js";

const ZERO_ROOT = `0x${"0".repeat(64)}`;

// A CID's bytes through the node (checked against the CID there; the root is checked by the caller).
export async function fetchBytes(cid) {
  const r = await fetch(`/app/ipfs/${encodeURIComponent(cid)}`);
  if (!r.ok) throw new Error(`the node could not give ${cid}: ${(await r.text()).trim()}`);
  return new Uint8Array(await r.arrayBuffer());
}

function percent(part, whole) {
  return whole > 0n ? Number((part * 10000n) / whole) / 100 : 0;
}

// `met`: decided by the contract's own rule, in integers (the percentage is only what is drawn).
function bar(label, value, met, { line } = {}) {
  const width = Math.min(100, value);
  return h(
    "div",
    { class: "bar", title: `${label}: ${value.toFixed(1)} %${line ? ` (line at ${line.toFixed(1)} %)` : ""}` },
    h("div", { class: met ? "fill met" : "fill", "data-width": width.toFixed(1) }),
    line ? h("div", { class: "line", "data-left": line.toFixed(1) }) : null,
    h("span", {}, `${label} ${value.toFixed(1)} %`),
  );
}

// Widths set from data attributes through CSSOM (allowed under style-src 'self'; inline style attributes
// are not).
export function sizeBars(root) {
  for (const el of root.querySelectorAll("[data-width]")) el.style.width = `${el.dataset.width}%`;
  for (const el of root.querySelectorAll("[data-left]")) el.style.left = `${el.dataset.left}%`;
}

function progress(p, params) {
  const votes = p.forWeight + p.againstWeight;
  const quorum = percent(p.forWeight, params.quorum);
  const share = votes > 0n ? percent(p.forWeight, votes) : 0;
  return h(
    "div",
    { class: "progress" },
    bar("quorum", quorum, p.forWeight >= params.quorum),
    bar("for", share, p.forWeight > 2n * p.againstWeight, { line: 66.67 }), // the registry: for > 2 x against
  );
}

function timeLeft(p, now, params) {
  if (p.state === "Pending") return `voting opens in ${duration(Number(p.voteStart) - now)}`;
  if (p.state === "Active") return `${duration(Number(p.voteEnd) - now)} left to vote`;
  if (p.state === "Queued") return `executable in ${duration(Number(p.voteEnd) + Number(params.executionDelay) - now)}`;
  if (p.state === "Succeeded") return `executable for ${duration(Number(p.voteEnd) + Number(params.executionDelay) + Number(params.gracePeriod) - now)}`;
  return "";
}

export async function proposalsPage(main, chain) {
  const [proposals, params, now] = await Promise.all([chain.proposals(), chain.parameters(), chain.now()]);
  const rows = proposals.map((p) =>
    h(
      "tr",
      { "data-proposal": proposalId(p.id) },
      h("td", {}, h("a", { href: `#/proposal/${proposalId(p.id)}` }, short(proposalId(p.id)))),
      h("td", {}, p.kind === "library" ? `library v${Number(p.parentVersion) + 1} (${p.treeSize} experiences)` : chain.describeCall(p.target, p.data).text),
      h("td", { class: `state ${p.state}` }, p.state),
      h("td", {}, timeLeft(p, now, params)),
      h("td", { class: "num" }, p.forWeight.toString()),
      h("td", { class: "num" }, p.againstWeight.toString()),
      h("td", {}, progress(p, params)),
    ),
  );
  replace(
    main,
    h("h1", {}, "Proposals"),
    h("p", { class: "muted" }, `Quorum ${params.quorum} quadratic weight for; passes with two thirds of the weight cast. Library version ${params.currentVersion} is current.`),
    proposals.length === 0
      ? h("p", {}, "No proposals yet.")
      : h(
          "table",
          { id: "proposals" },
          h("thead", {}, h("tr", {}, ["proposal", "what", "state", "time", "for", "against", "quorum · 2/3"].map((t) => h("th", {}, t)))),
          h("tbody", {}, rows),
        ),
  );
  sizeBars(main);
}

// One experience as a list item, as text (the draft page adds its buttons to it).
export function experience(e, cls = "") {
  return h(
    "li",
    { class: `experience ${cls}`, "data-id": e.id },
    h("span", { class: "domain" }, e.domain),
    " ",
    h("span", { class: "kind" }, `${e.kind === "example" ? "example" : "lesson"} · confidence ${e.confidence}`),
    h("p", { class: "text" }, e.text),
    e.answer ? h("p", { class: "answer" }, `Answer: ${e.answer}`) : null,
  );
}

// The proposed library checked against its on-chain root, and its change against its parent version.
async function libraryCheck(chain, p) {
  const section = h("section", { id: "content" }, h("h2", {}, "Content"), h("p", {}, `Fetching ${p.cid} …`));
  const fill = async () => {
    let bytes;
    try {
      bytes = await fetchBytes(p.cid);
    } catch (e) {
      replace(section, h("h2", {}, "Content"), h("p", { class: "verdict bad", id: "root-check" }, `Not verified: ${e.message}`));
      return;
    }
    const read = readLibrary(bytes);
    const problems = [...read.problems];
    if (read.library) {
      if (read.root !== p.root) problems.push(`the content's Merkle root is ${read.root}, the proposal's on chain is ${p.root}`);
      if (BigInt(read.library.experiences.length) !== p.treeSize) problems.push(`the content holds ${read.library.experiences.length} experiences, the proposal says ${p.treeSize}`);
    }
    let parent = null;
    if (read.library && p.parentVersion > 0n) {
      const v = await chain.version(p.parentVersion);
      if (BigInt(read.library.version) !== p.parentVersion + 1n) problems.push(`the content is version ${read.library.version}, the proposal builds version ${p.parentVersion + 1n}`);
      if (read.library.parent_root !== v.root) problems.push(`the content names parent root ${read.library.parent_root || "(none)"}, version ${p.parentVersion} has ${v.root}`);
      try {
        parent = readLibrary(await fetchBytes(v.cid)).library ?? null;
      } catch (e) {
        problems.push(`the parent version's content could not be read: ${e.message}`);
      }
    }
    const verdict =
      problems.length === 0
        ? h("p", { class: "verdict good", id: "root-check" }, `Verified in this browser: the ${bytes.length} bytes of ${p.cid} rebuild the root ${p.root}.`)
        : h("div", { class: "verdict bad", id: "root-check" }, h("p", {}, "Does not match the proposal:"), h("ul", {}, problems.map((x) => h("li", {}, x))));
    const change = read.library ? diff(parent, read.library) : null;
    replace(
      section,
      h("h2", {}, "Content"),
      verdict,
      change
        ? [
            h("h3", {}, `Added (${change.added.length})`),
            h("ul", { class: "experiences", id: "added" }, change.added.map((e) => experience(e, "added"))),
            h("h3", {}, `Removed (${change.removed.length})`),
            h("ul", { class: "experiences", id: "removed" }, change.removed.map((e) => experience(e, "removed"))),
            h("h3", {}, `Edited (${change.edited.length})`),
            h(
              "ul",
              { class: "experiences", id: "edited" },
              change.edited.map(({ before, after }) => [experience(before, "removed"), experience(after, "added")]),
            ),
          ]
        : null,
    );
  };
  return { section, fill };
}

function score(d) {
  return `${d.score.toFixed(3)} [${d.ci95[0].toFixed(3)}, ${d.ci95[1].toFixed(3)}]`;
}

// The proposal's measured effect (dao review --eval): A the parent version, B the proposed one, scored on a
// task file this node ships through its own model, with the paired difference and its interval.
function effectSection(chain, p) {
  const tasks = chain.config.tasks ?? [];
  const section = h("section", { id: "effect" }, h("h2", {}, "Measured effect"));
  if (tasks.length === 0) {
    section.append(h("p", { class: "muted" }, "This node serves no model, so it measures no effects: open a full node's web app, or run zoo-node dao review --eval."));
    return section;
  }
  section.append(...effectForm(tasks, { proposal: proposalId(p.id) }, ["A: parent version", "B: this proposal"]));
  return section;
}

// A task file to choose, a Measure button, and the figures once the node has scored A and B (`request`:
// the proposal, or a draft's bytes); shared by a proposal's page and the draft page.
export function effectForm(tasks, request, [a, b]) {
  const select = h("select", { id: "effect-task" }, tasks.map((t) => h("option", { value: t }, t)));
  const out = h("div", { id: "effect-result" });
  const measure = async () => {
    replace(out, h("p", {}, `Scoring A and B on ${select.value} with this node's model …`));
    try {
      const r = await fetch("/app/effect", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ ...request, task: select.value }) });
      const e = await r.json();
      if (!r.ok) throw new Error(e.error?.message ?? `HTTP ${r.status}`);
      const d = e.difference;
      replace(
        out,
        h("table", { class: "facts" }, h("tbody", {},
          h("tr", {}, h("th", {}, a), h("td", {}, score(e))),
          h("tr", {}, h("th", {}, b), h("td", {}, score(e.compare))),
        )),
        h("p", { id: "effect-difference" }, `B - A: ${d.difference >= 0 ? "+" : ""}${d.difference.toFixed(3)}, 95% interval [${d.ci95[0].toFixed(3)}, ${d.ci95[1].toFixed(3)}] (paired bootstrap over ${d.n} tasks; B better on ${d.better}, worse on ${d.worse}; model ${e.configuration.model})`),
      );
    } catch (err) {
      replace(out, h("p", { class: "verdict bad" }, `Not measured: ${err.message}`));
    }
  };
  return [h("p", {}, "Task file ", select, " ", h("button", { id: "measure", onclick: measure }, "Measure")), out];
}

export async function proposalPage(main, chain, id, actions) {
  const [p, params, now] = await Promise.all([chain.proposal(BigInt(id)), chain.parameters(), chain.now()]);
  if (!p) {
    replace(main, h("h1", {}, "Proposal not found"), h("p", {}, `No proposal ${id} on this chain.`));
    return;
  }
  const facts = [
    ["state", h("span", { class: `state ${p.state}`, id: "state" }, p.state)],
    ["proposer", p.proposer],
    ["voting", `${when(p.voteStart)} to ${when(p.voteEnd)} ${timeLeft(p, now, params) ? `(${timeLeft(p, now, params)})` : ""}`],
    ["for / against", `${p.forWeight} / ${p.againstWeight} (quadratic weight)`],
  ];
  let content = null;
  if (p.kind === "library") {
    facts.push(["builds on", `version ${p.parentVersion}`], ["root", p.root], ["experiences", p.treeSize.toString()], ["CID", p.cid]);
    content = await libraryCheck(chain, p);
  } else {
    facts.push(["calls", h("span", { id: "call" }, `${p.call.text} on ${p.call.where}`)]);
  }
  const buttons = h("div", { class: "actions" });
  if (chain.account) {
    const weight = await chain.votingWeight(p.id, chain.account).catch(() => 0n);
    const voted = await chain.read("hasVoted", [p.id, chain.account]);
    if (p.state === "Active") {
      buttons.append(
        h("p", {}, voted ? "You voted on this proposal." : `Your weight on this proposal: ${weight} (√ of your votes at its snapshot).`),
        h("button", { id: "vote-for", disabled: voted || weight === 0n, onclick: () => actions.run("vote", [p.id, true]) }, "Vote for"),
        h("button", { id: "vote-against", disabled: voted || weight === 0n, onclick: () => actions.run("vote", [p.id, false]) }, "Vote against"),
      );
    }
    if (p.state === "Succeeded") buttons.append(h("button", { id: "execute", onclick: () => actions.run("execute", [p.id]) }, "Execute"));
    if (["Pending", "Active"].includes(p.state) && p.proposer.toLowerCase() === chain.account.toLowerCase()) {
      buttons.append(h("button", { id: "cancel", onclick: () => actions.run("cancel", [p.id]) }, "Cancel"));
    }
  } else {
    buttons.append(h("p", { class: "muted" }, "Connect a wallet to vote, execute or cancel."));
  }
  replace(
    main,
    h("h1", {}, p.kind === "library" ? "Library proposal" : "Call proposal"),
    h("p", { class: "mono", id: "proposal-id" }, proposalId(p.id)),
    h("dl", {}, facts.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])),
    progress(p, params),
    buttons,
    content?.section,
    p.kind === "library" ? effectSection(chain, p) : null,
  );
  sizeBars(main);
  await content?.fill();
}

export async function libraryPage(main, chain) {
  const [version, root, treeSize, cid] = await chain.read("currentLibrary");
  if (version === 0n) {
    replace(main, h("h1", {}, "Library"), h("p", {}, "No library version has been approved yet."));
    return;
  }
  const read = readLibrary(await fetchBytes(cid));
  const ok = read.library && read.root === root && read.problems.length === 0;
  replace(
    main,
    h("h1", {}, `Library version ${version}`),
    h("p", { class: ok ? "verdict good" : "verdict bad", id: "root-check" }, ok ? `Verified in this browser: ${treeSize} experiences rebuild the root ${root}.` : `Does not match the chain: ${[...read.problems, read.root !== root ? `root ${read.root} is not ${root}` : ""].filter(Boolean).join("; ")}`),
    h("ul", { class: "experiences", id: "experiences" }, (read.library?.experiences ?? []).map((e) => experience(e))),
  );
}

function table(rows) {
  return h("table", { class: "facts" }, h("tbody", {}, rows.map(([k, v]) => h("tr", {}, h("th", {}, k), h("td", {}, v)))));
}

async function drawStatus(box) {
  const r = await fetch("/app/status.json");
  if (!r.ok) {
    replace(box, h("p", {}, (await r.text()).trim()));
    return false;
  }
  const s = await r.json();
  const serving = s.serving ?? {};
  replace(
    box,
    h("p", { class: "muted" }, `zoo-node ${s.node_version}, up ${duration(s.uptime_seconds)} (${s.role}); updates every 2 s.`),
    h("h2", {}, "Components"),
    h(
      "table",
      { id: "components" },
      h("tbody", {}, (s.components ?? []).map((c) => {
        const state = String(c.state).replace("COMPONENT_STATE_", "");
        return h("tr", { "data-component": c.name }, h("th", {}, c.name), h("td", { class: `state ${state}` }, state), h("td", {}, c.detail));
      })),
    ),
    h("h2", {}, "Serving"),
    table([
      ["model", `${s.model_id || "none"}${s.model_sha256 ? ` (sha256 ${short(s.model_sha256, 16)})` : ""}`],
      ["running", `${serving.running ?? 0} of ${serving.max_batch_size ?? 0}`],
      ["waiting", `${serving.waiting ?? 0} of ${serving.max_queued ?? 0}`],
      ["admitted since start", String(serving.admitted ?? 0)],
      ["HTTP", s.http_address || "off"],
      ["gRPC", s.listen_address],
    ]),
    h("h2", {}, "Library"),
    table([
      ["version", String(s.library?.version ?? 0)],
      ["root", s.library?.root || "none"],
      ["experiences", String(s.library?.experience_count ?? 0)],
    ]),
    h("h2", {}, "Peers and credits"),
    table([
      ["peers", `${s.peers?.connected ?? 0} connected, ${s.peers?.capable ?? 0} capable, ${s.peers?.banned ?? 0} banned`],
      ["node account", s.node_address],
      ["credits", s.ledger_address ? `ledger ${s.ledger_address}, epochs of ${s.credit_epoch_seconds} s` : "off"],
    ]),
  );
  return true;
}

// The operator's jobs: only with the admin token, which the operator types here and which stays in this
// browser tab (sessionStorage); the node never puts it in a page.
const TOKEN = "zoo-admin-token";

async function drawJobs(box, redraw) {
  const token = sessionStorage.getItem(TOKEN);
  if (!token) {
    const input = h("input", { id: "admin-token", type: "password", autocomplete: "off", size: 48, placeholder: "the node's admin token (DATA_DIR/admin.token)" });
    replace(box, h("p", {}, input, " ", h("button", { id: "show-jobs", onclick: () => { sessionStorage.setItem(TOKEN, input.value.trim()); redraw(); } }, "Show jobs")));
    return;
  }
  const auth = { authorization: `Bearer ${token}` };
  const r = await fetch("/app/jobs.json", { headers: auth });
  const forget = h("button", { id: "forget-token", onclick: () => { sessionStorage.removeItem(TOKEN); redraw(); } }, "Forget the token");
  if (!r.ok) {
    const e = await r.json().catch(() => ({}));
    replace(box, h("p", { class: "verdict bad", id: "jobs-refused" }, e.error?.message ?? `HTTP ${r.status}`), forget);
    return;
  }
  const { jobs } = await r.json();
  const cancel = async (id) => {
    const c = await fetch(`/app/jobs/${encodeURIComponent(id)}/cancel`, { method: "POST", headers: auth });
    if (!c.ok) box.prepend(h("p", { class: "verdict bad" }, (await c.json()).error?.message ?? `HTTP ${c.status}`));
    await redraw();
  };
  replace(
    box,
    jobs.length === 0
      ? h("p", { id: "no-jobs" }, "No jobs on this node.")
      : h(
          "table",
          { id: "jobs" },
          h("thead", {}, h("tr", {}, ["job", "kind", "state", "step", "created", "error", ""].map((t) => h("th", {}, t)))),
          h(
            "tbody",
            {},
            jobs.map((j) =>
              h(
                "tr",
                { "data-job": j.id },
                h("td", { class: "mono" }, j.id),
                h("td", {}, j.kind),
                h("td", { class: `state ${j.state}` }, j.state),
                h("td", { class: "num" }, String(j.step ?? 0)),
                h("td", {}, j.created_at ?? ""),
                h("td", {}, j.error ?? ""),
                h("td", {}, ["QUEUED", "RUNNING"].includes(j.state) && !j.cancel_requested ? h("button", { class: "cancel-job", onclick: () => cancel(j.id) }, "Cancel") : null),
              ),
            ),
          ),
        ),
    forget,
  );
}

// The node page: its status, refreshed every 2 s, and the operator's jobs below it (refreshed with it
// once the token is given; the token field itself is never redrawn while typed into).
export async function statusPage(main) {
  const statusBox = h("div", { id: "node-status" });
  const jobsBox = h("div", { id: "node-jobs" });
  replace(main, h("h1", {}, "Node"), statusBox, h("h2", {}, "Jobs (operator)"), jobsBox);
  const redrawJobs = () => drawJobs(jobsBox, redrawJobs).catch((e) => replace(jobsBox, h("p", { class: "verdict bad" }, e.message)));
  if (!(await drawStatus(statusBox))) return null;
  await redrawJobs();
  return async () => {
    await drawStatus(statusBox);
    if (sessionStorage.getItem(TOKEN)) await redrawJobs();
  };
}

export function holderBox(info) {
  const votes = formatUnits(info.votes, info.decimals);
  return [
    h("span", { id: "balance" }, `${formatUnits(info.balance, info.decimals)} KEEPER`),
    h("span", { id: "votes" }, `${votes} votes`),
    h("span", { id: "power", title: "quadratic voting power: √ of your votes in token units, as the registry counts it" }, `power ${info.power}`),
    h("span", { id: "delegate", title: info.delegate }, info.delegate === "0x0000000000000000000000000000000000000000" ? "not delegated" : `delegated to ${short(info.delegate)}`),
  ];
}

export { ZERO_ROOT };
