// Building the page from data: every value becomes a text node, never markup. Experience texts, CIDs and
// anything else read from the chain, IPFS or a peer are untrusted input; `h` is the only way this app puts
// content on the page, and it has no path that parses HTML.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") el.addEventListener(name.slice(2), value);
    else if (name === "class") el.className = value;
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
}

export function short(hex, keep = 10) {
  return typeof hex === "string" && hex.length > keep + 6 ? `${hex.slice(0, keep)}…${hex.slice(-4)}` : hex;
}

export function duration(seconds) {
  const s = Math.max(0, Math.floor(Number(seconds)));
  if (s < 90) return `${s} s`;
  if (s < 5400) return `${Math.round(s / 60)} min`;
  if (s < 172800) return `${(s / 3600).toFixed(1)} h`;
  return `${(s / 86400).toFixed(1)} days`;
}

export function when(unixSeconds) {
  return new Date(Number(unixSeconds) * 1000).toISOString().replace(".000Z", "Z");
}
