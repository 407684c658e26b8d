// gpushare console: one page, three views (#/ fleet, #/node/<name>, #/evictions).
// Plain JS: fetch the view's JSON, draw it with DOM nodes (never HTML strings), and fetch it
// again whenever the server-sent event stream /api/updates announces a new version.
"use strict";

const STATES = ["held", "shared", "lent", "idle", "unhealthy"];
const HOP_NAMES = {
  notice: "kernel notice", published: "owner-back event", handled: "solver took it",
  tasks_dead: "tasks dead", released: "owner released", evicted: "evicted",
};
let shown = { key: "", version: -1 };
let loading = null;

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") el.className = value;
    else if (name.startsWith("data")) el.setAttribute(name.replace(/[A-Z]/g, (c) => "-" + c.toLowerCase()), value);
    else el.setAttribute(name, value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

function svg(tag, attrs, ...children) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [name, value] of Object.entries(attrs || {})) el.setAttribute(name, value);
  for (const child of children.flat()) el.append(child instanceof Node ? child : document.createTextNode(child));
  return el;
}

function route() {
  const hash = decodeURIComponent(location.hash.replace(/^#/, "")) || "/";
  if (hash.startsWith("/node/")) return { page: "node", name: hash.slice(6), api: "/api/nodes/" + encodeURIComponent(hash.slice(6)) };
  if (hash.startsWith("/evictions")) return { page: "evictions", api: "/api/evictions" };
  return { page: "fleet", api: "/api/fleet" };
}

function shortCard(card) {
  return card ? card.replace(/^GPU-/, "") : "not allocatable";
}

function legend() {
  return h("div", { class: "legend" }, STATES.map((s) => h("span", { class: "state-" + s }, s)));
}

function mib(bytes) {
  return (bytes / 1048576).toFixed(0) + " MiB";
}

// a card's vendor figures (the detector's scrape of the exporter): utilisation, memory used of total
function usageText(usage) {
  if (!usage || usage.utilisation === null) return "";
  const memory = usage.memory_used !== null && usage.memory_total ? ` · ${mib(usage.memory_used)} / ${mib(usage.memory_total)}`
    : usage.memory_used !== null ? ` · ${mib(usage.memory_used)}` : "";
  return `${Math.round(usage.utilisation)} % busy${memory}`;
}

function utilisation(usage) {
  return usage && usage.utilisation !== null ? String(Math.round(usage.utilisation)) : null;
}

// --- fleet ------------------------------------------------------------------------------

// a DRA claim on a card: what it is for, the card's shares it takes, its pods
function claimText(c) {
  const shares = c.role === "share" && c.shares ? `, ${c.shares} shares` : "";
  return `${c.claim} (${c.role}${shares}) → ${c.pods.join(", ") || "no pod"}`;
}

function cardCell(card, node) {
  const claims = card.claims.length ? `${card.claims.length} claims` : "";
  const who = card.borrower ? "→ " + card.borrower : card.holder || claims;
  return h("div", {
    class: "card state-" + card.state, dataCard: card.card, dataNode: node, dataState: card.state,
    dataHolder: card.holder, dataSharers: card.sharers.join(","), dataBorrower: card.borrower,
    dataSpot: card.spot_health || null, dataClaims: String(card.claims.length), dataUtil: utilisation(card.usage),
    title: [card.card, card.label, card.holder, ...card.sharers, card.borrower, ...card.claims.map(claimText),
      card.spot_health ? "spot device: " + card.spot_health : "", usageText(card.usage)].filter(Boolean).join("\n"),
  }, h("b", {}, shortCard(card.card)), h("div", {}, card.label), h("div", { class: "who" }, who),
  utilisation(card.usage) !== null ? h("div", { class: "util" }, `${utilisation(card.usage)} %`) : null);
}

// gpushare's pods on the node, each with its readiness (its Ready condition: the kubelet's probe of /readyz)
function servicesLine(node) {
  if (!node.services.length) return h("div", { class: "services muted" }, "no gpushare pod seen");
  return h("div", { class: "services" }, node.services.map((s) => h("span", {
    class: "svc" + (s.ready ? "" : " down"), dataService: s.name, dataReady: String(s.ready),
    title: `${s.pod}: ${s.ready ? "ready" : "not ready"} (${s.phase || "?"})`,
  }, s.name)));
}

function drawFleet(doc) {
  const totals = STATES.map((s) => `${doc.totals[s]} ${s}`).join(" · ");
  const rows = doc.nodes.map((node) => h("div", { class: "node-row", dataNode: node.name },
    h("div", { class: "meta" },
      h("a", { href: "#/node/" + encodeURIComponent(node.name) }, node.name),
      h("span", { class: "badge" + (node.ready ? "" : " down") }, node.ready ? "Ready" : "not ready"),
      h("div", {}, `${node.cards.length} cards · spare ${node.spare.vcpu_millicores}m CPU, ${mib(node.spare.vmem_bytes)}`),
      servicesLine(node)),
    h("div", { class: "cards" }, node.cards.map((c) => cardCell(c, node.name)))));
  const waiting = ["nodes", "pods", "solver", "health"].filter((s) => !doc.synced.includes(s));
  return [h("h2", {}, `Fleet: ${doc.nodes.length} nodes`),
    waiting.length ? h("p", { class: "warn", id: "waiting" }, `still waiting for: ${waiting.join(", ")} (see /readyz)`) : null,
    h("p", { class: "muted", id: "totals" }, totals),
    legend(), rows.length ? h("div", { class: "fleet" }, rows) : h("p", { class: "empty" }, "no nodes yet")];
}

// --- one node ---------------------------------------------------------------------------

function activityOf(use) {
  // the pod's GPU activity on this card: the kernel module's calls per second (every vendor)
  if (!use) return null;
  const rate = use.calls_per_s === null ? (use.calls === null ? "GPU calls not counted yet" : `${use.calls} GPU calls`)
    : `${use.calls_per_s.toFixed(1)} GPU calls/s`;
  const util = use.utilisation === null ? "" : ` · ${use.utilisation.toFixed(0)}% (exporter)`;
  return h("span", { class: "activity", dataCalls: use.calls ?? "", dataCallsPerS: use.calls_per_s ?? "", dataRole: use.role },
    ` · ${rate}${util}`);
}

function podItem(row, role, use) {
  const text = row.known ? `${row.key} (${row.kind}, ${row.phase || "?"}${row.terminating ? ", terminating" : ""})` : `${row.key} (gone)`;
  return h("li", { class: role, dataPod: row.key }, text, activityOf(use));
}

function cardPanel(card) {
  const parts = [h("h3", {}, shortCard(card.card), " ", h("span", { class: "muted" }, card.label))];
  if (card.usage) parts.push(h("div", { class: "util muted" }, usageText(card.usage) || "utilisation unknown"));
  if (card.holder_pod) {
    const role = card.holder_kind === "shadow" ? `ShadowPod (${card.share_devices} virtual devices)` : card.holder_kind === "spot-owner" ? "owner (away)" : "owner";
    parts.push(h("div", { class: "role" }, role), h("ul", {}, podItem(card.holder_pod, "holder", card.activity[card.holder])));
  }
  if (card.holder_kind === "shadow") {
    parts.push(h("div", { class: "role" }, `SharePods (${card.sharer_pods.length})`),
      card.sharer_pods.length ? h("ul", {}, card.sharer_pods.map((p) => podItem(p, "sharer", card.activity[p.key]))) : h("p", { class: "muted" }, "none"));
  }
  if (card.claims.length) {
    parts.push(h("div", { class: "role" }, `ResourceClaims (${card.claims.length})`), h("ul", {}, card.claims.map((c) =>
      h("li", { class: "claim", dataClaim: c.claim, dataRole: c.role, dataShares: String(c.shares), dataPods: c.pods.join(",") },
        claimText(c)))));
  }
  if (card.borrower_pod) parts.push(h("div", { class: "role" }, "borrower"), h("ul", {}, podItem(card.borrower_pod, "borrower", card.activity[card.borrower])));
  if (card.spot_health) parts.push(h("div", { class: "spot muted" }, `spot device: ${card.spot_health}`));
  return h("section", {
    class: "card-panel state-" + card.state, dataCard: card.card, dataState: card.state, dataHolder: card.holder,
    dataSharers: card.sharers.join(","), dataBorrower: card.borrower, dataSpot: card.spot_health || null,
    dataUtil: utilisation(card.usage),
  }, parts);
}

function drawNode(doc) {
  const spare = h("div", { class: "spare" },
    h("div", { id: "spare-cpu" }, h("b", {}, `${doc.spare.vcpu_millicores}m`), `spare CPU (${doc.spare.vcpu_devices} gpushare/vcpu)`),
    h("div", { id: "spare-mem" }, h("b", {}, mib(doc.spare.vmem_bytes)), `spare memory (${doc.spare.vmem_devices} gpushare/vmem)`));
  const pods = h("table", { id: "pods" }, h("tr", {}, ["pod", "kind", "phase", "share", "device owner", "DRA claims"].map((t) => h("th", {}, t))),
    doc.pods.map((p) => h("tr", { class: "pod", dataPod: p.key, dataKind: p.kind, dataPhase: p.phase, dataClaims: p.claims.join(",") },
      h("td", {}, p.key), h("td", {}, p.kind + (p.lendable ? " (lendable)" : "")), h("td", {}, p.terminating ? "Terminating" : p.phase),
      h("td", {}, p.share), h("td", {}, p.device_owner), h("td", {}, p.claims.join(", ")))));
  return [h("h2", {}, doc.name, h("span", { class: "badge" + (doc.ready ? "" : " down") }, doc.ready ? "Ready" : "not ready")),
    legend(), h("div", { class: "panels" }, doc.cards.map(cardPanel)), spare,
    h("h3", {}, `Pods on ${doc.name} (${doc.pods.length})`), pods];
}

// --- evictions --------------------------------------------------------------------------

function hopChart(hops) {
  // one row per hop: its name, a bar from the kernel's notice to the hop, the time
  const width = 640, left = 130, right = 80, row = 18;
  const end = Math.max(1, ...hops.map((x) => x.at_ms)), scale = (width - left - right) / end;
  const rows = hops.map((hop, i) => {
    const y = i * row, bar = Math.max(2, hop.at_ms * scale);
    return svg("g", { class: "hop", "data-hop": hop.hop, "data-ms": hop.at_ms },
      svg("text", { x: left - 8, y: y + 13, "text-anchor": "end" }, HOP_NAMES[hop.hop] || hop.hop),
      svg("rect", { x: left, y: y + 4, width: bar, height: 11, rx: 2 }),
      svg("text", { x: left + bar + 6, y: y + 13 }, `${hop.at_ms.toFixed(1)} ms`));
  });
  return svg("svg", { class: "hops", width: width, height: hops.length * row + 4, viewBox: `0 0 ${width} ${hops.length * row + 4}` },
    svg("line", { class: "axis", x1: left, y1: 0, x2: left, y2: hops.length * row + 4 }), rows);
}

function drawEntry(entry) {
  const when = new Date(entry.at * 1000).toLocaleTimeString();
  const ob = entry.owner_back;
  const rows = entry.evictions.map((r) => h("tr", { class: "eviction", dataPod: r.pod, dataReason: r.reason, dataOutcome: r.outcome },
    h("td", {}, r.pod), h("td", {}, r.reason), h("td", {}, r.outcome + (r.error ? `: ${r.error}` : "")),
    ["kill_ms", "tasks_dead_ms", "released_ms", "delete_ms", "total_ms"].map((k) => h("td", {}, r[k].toFixed(1)))));
  return h("article", { class: "entry", dataTrigger: entry.trigger, dataReason: entry.reason, dataNode: entry.node },
    h("header", {}, h("span", {}, when), h("span", { class: "reason reason-" + entry.reason }, entry.reason),
      h("span", {}, entry.node), h("span", {}, entry.owner ? `owner ${entry.owner}` : ""),
      ob ? h("span", { class: "muted" }, `kernel notice pid ${ob.pid}, pid namespace ${ob.pidns}`) : null),
    entry.hops.length ? hopChart(entry.hops) : null,
    rows.length ? h("table", {}, h("tr", {}, ["pod", "reason", "outcome", "kill ms", "tasks dead ms", "released ms", "delete ms", "total ms"].map((t) => h("th", {}, t))), rows)
      : h("p", { class: "muted" }, "no borrower to evict"));
}

function drawEvictions(doc) {
  return [h("h2", {}, `Evictions (${doc.entries.length})`),
    doc.entries.length ? doc.entries.map(drawEntry) : h("p", { class: "empty" }, "no eviction yet")];
}

// --- loading and live updates -------------------------------------------------------------

async function load(force) {
  const where = route();
  const key = where.page + ":" + (where.name || "");
  if (loading) return loading.then(() => load(force));
  loading = (async () => {
    try {
      const response = await fetch(where.api, { cache: "no-store" });
      const doc = await response.json();
      if (!response.ok) throw new Error(doc.error || response.statusText);
      if (!force && key === shown.key && doc.version === shown.version) return;
      const draw = { fleet: drawFleet, node: drawNode, evictions: drawEvictions }[where.page];
      const view = document.getElementById("view");
      view.replaceChildren(...draw(doc).flat().filter(Boolean));
      view.dataset.version = doc.version;
      document.body.dataset.page = where.page;
      shown = { key, version: doc.version };
    } catch (err) {
      document.getElementById("view").replaceChildren(h("p", { class: "empty", id: "error" }, String(err)));
      document.body.dataset.page = "error";
    } finally {
      loading = null;
    }
    for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.id === "nav-" + (where.page === "node" ? "fleet" : where.page));
  })();
  return loading;
}

function follow() {
  const live = document.getElementById("live");
  const source = new EventSource("/api/updates");
  source.addEventListener("version", (event) => {
    const version = JSON.parse(event.data).version;
    live.dataset.state = "live";
    live.dataset.version = version;
    live.textContent = "live · v" + version;
    if (version !== shown.version) load(false);
  });
  source.onerror = () => {
    live.dataset.state = "lost";
    live.textContent = "reconnecting";
  };
}

window.addEventListener("hashchange", () => load(true));
load(true);
follow();
