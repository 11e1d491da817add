// A library version checked in the browser: its bytes must be the one canonical encoding
// (zoo.registry.canonical: sorted keys, no whitespace, JSON's own escapes, integers only), and its Merkle
// root is rebuilt from them as RFC 9162 says (zoo.registry.merkle): leaf = sha256(0x00 || experience's
// canonical bytes), node = sha256(0x01 || left || right), the empty tree's root sha256(""). Nothing here
// trusts the node that served the bytes.

import { bytesToHex, concat, sha256 } from "viem";

const utf8 = new TextEncoder();
const LEAF = new Uint8Array([0]);
const NODE = new Uint8Array([1]);

export function canonical(value) {
  if (value === null || typeof value === "boolean") return JSON.stringify(value);
  if (typeof value === "string") {
    if (!value.isWellFormed()) throw new Error("a string with a lone surrogate (not Unicode text)");
    if (value.normalize("NFC") !== value) throw new Error(`a string that is not in Unicode NFC: ${JSON.stringify(value.slice(0, 40))}`);
    return JSON.stringify(value);
  }
  if (typeof value === "number") {
    if (!Number.isSafeInteger(value)) throw new Error(`a number that is not a safe integer: ${value}`);
    return String(value);
  }
  if (Array.isArray(value)) return `[${value.map(canonical).join(",")}]`;
  const keys = Object.keys(value).sort();
  return `{${keys.map((k) => `${JSON.stringify(k)}:${canonical(value[k])}`).join(",")}}`;
}

function hash(...parts) {
  return sha256(concat(parts), "bytes");
}

export function merkleRoot(leaves) {
  if (leaves.length === 0) return bytesToHex(sha256(new Uint8Array(0), "bytes"));
  let level = leaves.map((leaf) => hash(LEAF, leaf));
  // RFC 9162's split at the largest power of two below n is the same tree as pairing left to right and
  // carrying an odd last node up unchanged.
  while (level.length > 1) {
    const next = [];
    for (let i = 0; i < level.length; i += 2) next.push(i + 1 < level.length ? hash(NODE, level[i], level[i + 1]) : level[i]);
    level = next;
  }
  return bytesToHex(level[0]);
}

// The library in `bytes`, or why it is not one: {library, root, problems[]}.
export function readLibrary(bytes) {
  let text;
  try {
    text = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true }).decode(bytes); // a BOM stays, and fails
  } catch {
    return { problems: ["the content is not UTF-8 text"] };
  }
  let library;
  try {
    library = JSON.parse(text);
  } catch (e) {
    return { problems: [`the content is not JSON: ${e.message}`] };
  }
  if (!library || typeof library !== "object" || !Array.isArray(library.experiences)) {
    return { problems: ["the content is not an experience library (no experiences list)"] };
  }
  const problems = [];
  let encoded;
  try {
    encoded = canonical(library);
  } catch (e) {
    return { problems: [e.message] };
  }
  if (encoded !== text) problems.push("the bytes are not the library's canonical encoding (another CID could hold the same library)");
  if (!["zoo.experience-library/1", "zoo.experience-library/2", "zoo.experience-library/3", "zoo.experience-library/4"].includes(library.schema)) {
    problems.push(`unknown format ${JSON.stringify(String(library.schema)).slice(0, 60)}`);
  }
  // One id once, in ascending order (as every node requires): else two experiences could share an id, and
  // a page matching by id would show one while the root covers both.
  let previous = "";
  for (const e of library.experiences) {
    if (!e || typeof e !== "object" || typeof e.id !== "string") {
      problems.push("an experience without an id");
      break;
    }
    if (e.id <= previous) {
      problems.push(e.id === previous ? `experience id ${e.id} occurs more than once` : `experiences are not sorted by id (${e.id} after ${previous})`);
      break;
    }
    previous = e.id;
  }
  const root = merkleRoot(library.experiences.map((e) => utf8.encode(canonical(e))));
  return { library, root, problems };
}

// Experiences added, removed and edited from `parent` to `library`, matched by id.
export function diff(parent, library) {
  const before = new Map((parent?.experiences ?? []).map((e) => [e.id, e]));
  const after = new Map(library.experiences.map((e) => [e.id, e]));
  const added = [...after.values()].filter((e) => !before.has(e.id));
  const removed = [...before.values()].filter((e) => !after.has(e.id));
  const edited = [...after.values()]
    .filter((e) => before.has(e.id) && canonical(before.get(e.id)) !== canonical(e))
    .map((e) => ({ before: before.get(e.id), after: e }));
  return { added, removed, edited };
}
