// The operator page: asks this replica's JSON API for everything it shows, with the operator
// token as a bearer header (docs/adr/0027). Every value from the API reaches the page through
// textContent or an SVG attribute, never as markup, so nothing an API field holds (a Domain's
// name, a rule id) can become script.
"use strict";

(function () {
  const TOKEN_KEY = "plexsphere.operator-token";
  const REFRESH_MS = 5000;
  const OUTCOMES = [
    "granted", "refused", "precheck_refused", "fallback_granted",
    "fallback_refused", "shadow_refused", "open_granted", "error",
  ];
  const SCOPES = [
    "secret_read_node", "secret_read_domain", "access_issuance_domain", "ingest_node", "ingest_domain",
  ];

  let timer = null;
  let pending = null;

  function $(id) { return document.getElementById(id); }

  // An element with attributes and children (strings become text nodes, never markup).
  function el(tag, attributes, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attributes || {})) {
      if (value !== undefined && value !== null) node.setAttribute(name, String(value));
    }
    for (const child of children) {
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function svg(tag, attributes) {
    const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [name, value] of Object.entries(attributes || {})) node.setAttribute(name, String(value));
    return node;
  }

  function setText(id, text, className) {
    const node = $(id);
    node.textContent = text;
    if (className !== undefined) node.className = className;
  }

  function formatNumber(value) {
    if (value === null || value === undefined) return "–";
    if (Math.abs(value) >= 1000) return Math.round(value).toLocaleString("en");
    return (Math.round(value * 100) / 100).toString();
  }

  // The URL's fragment (#token=...&key=...), which browsers never send to the server: a
  // token given there is moved into sessionStorage and wiped from the address bar at once.
  function readFragment() {
    const fragment = new URLSearchParams(window.location.hash.replace(/^#/, ""));
    const token = fragment.get("token");
    const key = fragment.get("key");
    const service = fragment.get("service");
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
    if (token) {
      const keep = new URLSearchParams();
      if (key) keep.set("key", key);
      if (service) keep.set("service", service);
      const rest = keep.toString();
      history.replaceState(null, "", window.location.pathname + (rest ? "#" + rest : ""));
    }
    return { key, service };
  }

  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  async function api(path) {
    const token = sessionStorage.getItem(TOKEN_KEY);
    const response = await fetch(path, {
      headers: { Authorization: "Bearer " + token, Accept: "application/json" },
      cache: "no-store",
      credentials: "omit",
      redirect: "error",
    });
    let body = null;
    try { body = await response.json(); } catch (_) { body = null; }
    if (!response.ok) {
      const code = body && body.code ? body.code : "http_" + response.status;
      const message = body && body.error ? body.error : response.statusText;
      throw new ApiError(response.status, code, message);
    }
    return body;
  }

  function showError(error) {
    const node = $("error");
    if (!error) { node.hidden = true; node.textContent = ""; return; }
    node.hidden = false;
    node.textContent = error.code ? error.code + ": " + error.message : String(error);
  }

  function lock(reason) {
    sessionStorage.removeItem(TOKEN_KEY);
    if (timer) clearInterval(timer);
    timer = null;
    $("main").hidden = true;
    $("lock").hidden = true;
    $("token-form").hidden = false;
    document.body.dataset.state = "locked";
    if (reason) {
      const hint = $("token-form").querySelector(".hint");
      hint.textContent = reason;
      hint.className = "hint error";
    }
  }

  function renderStatus(status) {
    const leader = status.leader;
    let text;
    let className = "";
    if (leader.this_replica) {
      text = "this replica";
      className = "ok";
    } else if (!leader.holder_known) {
      text = "unknown (the database did not say)";
      className = "warn";
    } else if (leader.holder) {
      text = "another replica";
      className = "";
    } else {
      text = "none";
      className = "bad";
    }
    if (leader.holder) {
      const holder = leader.holder;
      text += " — session " + holder.pid;
      if (holder.client_addr) text += " from " + holder.client_addr;
      if (holder.session_started_at) text += ", since " + holder.session_started_at;
    }
    setText("leader", text, className);
    document.body.dataset.leader = leader.this_replica ? "this" : (leader.holder ? "other" : "none");

    const rules = status.rules;
    setText("snapshot-version", rules.loaded ? "version " + rules.snapshot_version : "not loaded", rules.loaded ? "" : "bad");
    setText("snapshot-age", rules.loaded ? "(known current " + formatNumber(rules.snapshot_age_seconds) + " s ago)" : "");
    setText("tiers-version", "version " + rules.tiers_version);
    setText("store", status.store_failing ? "failing: fail modes decide" : "answering", status.store_failing ? "bad" : "ok");
    setText("precheck", status.precheck_buckets + " buckets");
    // Hot buckets this replica grants from memory (PLEXSPHERE_LEASE_MS), most held first.
    const leased = status.leased || [];
    setText("leased", leased.length === 0 ? "none" : leased.map((lease) =>
      lease.budget + " " + lease.key + " (" + formatNumber(lease.held) + " held)").join("; "));

    const head = $("decisions-head");
    if (head.children.length === 1) {
      for (const outcome of OUTCOMES) head.append(el("th", { class: "num" }, outcome));
    }
    const counts = new Map();
    for (const row of status.decisions) counts.set(row.scope + "/" + row.outcome, row.count);
    const body = el("tbody");
    for (const scope of SCOPES) {
      const row = el("tr", { "data-scope": scope }, el("td", {}, scope));
      for (const outcome of OUTCOMES) {
        const count = counts.get(scope + "/" + outcome) || 0;
        row.append(el("td", { class: count ? "num" : "num zero", "data-outcome": outcome }, count));
      }
      body.append(row);
    }
    $("decisions").tBodies[0].replaceWith(body);
  }

  // The levels this replica's decisions left, one bar per slot over the window (empty at the
  // bottom, the burst at the top): a bar's top is the level the slot's last decision left,
  // its tick the lowest level of the slot; a slot with refusals is drawn in the refusal
  // colour.
  function sparkline(bucket, fill) {
    const width = 240;
    const height = 36;
    const chart = svg("svg", { class: "spark", width: width, height: height, viewBox: "0 0 " + width + " " + height, role: "img" });
    const end = Date.parse(fill.now);
    const start = end - fill.window_seconds * 1000;
    const slotWidth = (fill.slot_seconds / fill.window_seconds) * width;
    const x = (at) => Math.max(0, Math.min(width - slotWidth, ((Date.parse(at) - start) / (end - start)) * width));
    const y = (tokens) => height - 1 - Math.max(0, Math.min(1, tokens / bucket.burst)) * (height - 2);
    if (bucket.history.length === 0) {
      const label = svg("text", { x: 6, y: height / 2 + 3 });
      label.textContent = "no decisions here in the window";
      chart.append(label);
      return chart;
    }
    for (const sample of bucket.history) {
      const left = x(sample.at);
      const top = y(sample.tokens);
      chart.append(svg("rect", {
        class: sample.refused > 0 ? "slot refused" : "slot",
        x: left, y: top, width: Math.max(1.5, slotWidth - 0.8), height: Math.max(1, height - 1 - top),
      }));
      chart.append(svg("rect", { class: "low", x: left, y: y(sample.min_tokens), width: Math.max(1.5, slotWidth - 0.8), height: 1.2 }));
    }
    return chart;
  }

  function renderFill(fill) {
    $("subject").hidden = false;
    setText("subject-line", fill.kind === "domain"
      ? "Domain " + fill.name + " (" + fill.key + "), tier " + fill.tier
      : "Node " + fill.name + " (" + fill.key + ") of Domain " + fill.domain_name + " (" + fill.domain_id + "), tier " + fill.tier);
    setText("window", Math.round(fill.window_seconds / 60) + " min");
    const body = el("tbody");
    for (const bucket of fill.buckets) {
      const granted = bucket.history.reduce((sum, slot) => sum + slot.granted, 0);
      const refused = bucket.history.reduce((sum, slot) => sum + slot.refused, 0);
      // A SHADOW rule's refusals were admitted: counted apart, never as refusals.
      const shadowRefused = bucket.history.reduce((sum, slot) => sum + slot.shadow_refused, 0);
      const bar = el("span", { class: "bar" });
      const inner = el("span");
      // CSSOM, not a style attribute: the CSP allows the former only.
      inner.style.width = bucket.tokens === null ? "0" : Math.max(0, Math.min(100, (bucket.tokens / bucket.burst) * 100)) + "%";
      bar.append(inner);
      body.append(el("tr", { "data-scope": bucket.scope },
        el("td", {}, bucket.scope),
        el("td", { class: "num level" }, bucket.tokens === null ? "GCRA" : formatNumber(bucket.tokens) + " / " + formatNumber(bucket.burst)),
        el("td", {}, bar),
        el("td", { class: "num" }, formatNumber(bucket.per_second) + " / s"),
        el("td", { class: "history", "data-slots": bucket.history.length }, sparkline(bucket, fill)),
        el("td", { class: "num granted" }, granted),
        el("td", { class: "num refused" }, refused),
        el("td", { class: "num shadow-refused" }, shadowRefused)));
    }
    $("buckets").tBodies[0].replaceWith(body);
  }

  function renderLimits(limits, kind) {
    setText("rules-revision", limits.rules_revision);
    const body = el("tbody");
    for (const limit of limits.limits) {
      // A Node's page shows the Node's scopes; a Domain's, the Domain's.
      const perDomain = limit.scope.endsWith("_domain");
      if (perDomain !== (kind === "domain")) continue;
      const governed = limit.governed_by;
      body.append(el("tr", { "data-scope": limit.scope, "data-rule": governed.rule_id || "" },
        el("td", {}, limit.scope),
        el("td", {}, governed.level),
        el("td", { class: "rule-id" }, governed.rule_id || "(knobs)"),
        el("td", { class: "num" }, governed.version === undefined ? "" : governed.version),
        el("td", { class: "num" }, formatNumber(limit.per_second)),
        el("td", { class: "num" }, formatNumber(limit.burst)),
        el("td", {}, limit.algorithm),
        el("td", { class: limit.mode === "SHADOW" ? "warn" : "" }, limit.mode),
        el("td", {}, limit.fail_mode),
        el("td", {}, limit.outranked.map((rule) => rule.rule_id + " v" + rule.version).join(", "))));
    }
    $("rules").tBodies[0].replaceWith(body);
  }

  // A minute's decisions as bars: granted up, refused (and shadow refused) beside them.
  function usageSparkline(minutes) {
    const width = 120, height = 24;
    const chart = svg("svg", { class: "spark", width, height, viewBox: "0 0 " + width + " " + height, role: "img" });
    const most = Math.max(1, ...minutes.map((minute) => minute.granted + minute.refused + minute.shadow_refused));
    const slot = width / 60;
    const now = Date.now();
    for (const minute of minutes) {
      const age = Math.floor((now - Date.parse(minute.minute)) / 60000);
      if (age < 0 || age >= 60) continue;
      const x = width - (age + 1) * slot;
      const granted = (minute.granted / most) * height;
      const refused = ((minute.refused + minute.shadow_refused) / most) * height;
      chart.append(svg("rect", { class: "slot", x, y: height - granted, width: Math.max(1, slot - 0.5), height: granted }));
      chart.append(svg("rect", { class: "slot refused", x, y: height - granted - refused, width: Math.max(1, slot - 0.5), height: refused }));
    }
    return chart;
  }

  async function renderService(service) {
    const snapshot = await api("/v1/snapshot?service=" + encodeURIComponent(service));
    const since = new Date(Date.now() - 3600 * 1000).toISOString();
    const usages = await Promise.all(snapshot.rules.map((rule) =>
      api("/v1/rules/" + encodeURIComponent(rule.rule_id) + "/usage?since=" + encodeURIComponent(since))));
    $("service-view").hidden = false;
    setText("service-revision", snapshot.revision);
    const body = el("tbody");
    snapshot.rules.forEach((rule, index) => {
      const minutes = usages[index];
      const sum = (field) => minutes.reduce((total, minute) => total + minute[field], 0);
      const selector = Object.entries(rule.selector).map(([key, value]) => key + "=" + value).join(", ") || "(every request)";
      body.append(el("tr", { "data-rule": rule.rule_id },
        el("td", { class: "rule-id" }, rule.rule_id),
        el("td", {}, rule.api || rule.scope || ""),
        el("td", {}, selector),
        el("td", { class: "num" }, formatNumber(rule.rate / (rule.per_ms / 1000))),
        el("td", { class: "num" }, formatNumber(rule.burst)),
        el("td", { class: rule.mode === "SHADOW" ? "warn" : "" }, rule.mode),
        el("td", {}, rule.fail_mode),
        el("td", { class: "num" }, rule.priority),
        el("td", { class: "history" }, usageSparkline(minutes)),
        el("td", { class: "num granted" }, sum("granted")),
        el("td", { class: "num refused" }, sum("refused")),
        el("td", { class: "num shadow-refused" }, sum("shadow_refused"))));
    });
    $("service-rules").tBodies[0].replaceWith(body);
  }

  // "in 11 s" or "3 s ago", by this browser's clock (the exact instant is the cell's title).
  function fromNow(at) {
    if (!at) return "–";
    const seconds = Math.round((Date.parse(at) - Date.now()) / 1000);
    return seconds >= 0 ? "in " + seconds + " s" : -seconds + " s ago";
  }

  // A service's RLQS buckets: one row a holder, the bucket's own cells spanning its holders.
  async function renderQuota(service) {
    const listing = await api("/v1/quota/buckets?service=" + encodeURIComponent(service));
    $("quota-none").hidden = listing.buckets.length > 0;
    const body = el("tbody");
    for (const bucket of listing.buckets) {
      const span = Math.max(1, bucket.holders.length);
      const bucketCells = [
        el("td", { class: "rule-id", rowspan: span }, bucket.rule_id),
        el("td", { rowspan: span, title: bucket.key }, bucket.key.slice(0, 8)),
        el("td", { class: "num", rowspan: span }, formatNumber(bucket.rate)),
        el("td", { class: "num", rowspan: span }, formatNumber(bucket.burst)),
        el("td", { class: "num", rowspan: span, title: "at " + bucket.pool_at }, formatNumber(bucket.pool)),
      ];
      if (bucket.holders.length === 0) {
        body.append(el("tr", { "data-bucket": bucket.key }, ...bucketCells, el("td", { class: "muted", colspan: 9 }, "no holders")));
        continue;
      }
      bucket.holders.forEach((holder, index) => {
        // A closed stream's share counts until it expires; a share of nothing is a DENY_ALL.
        const state = holder.closed ? "muted" : (holder.max_tokens === 0 ? "warn" : undefined);
        body.append(el("tr", { "data-bucket": bucket.key, "data-holder": holder.holder, class: state },
          ...(index === 0 ? bucketCells : []),
          el("td", {}, holder.replica),
          el("td", { title: holder.holder }, holder.holder.slice(0, 8)),
          el("td", { class: "num demand" }, holder.demand === null ? "new" : formatNumber(holder.demand)),
          el("td", { class: "num assigned" }, formatNumber(holder.rate)),
          el("td", { class: "num max-tokens" }, formatNumber(holder.max_tokens)),
          el("td", { class: "num counted" }, formatNumber(holder.counted_rate)),
          el("td", { class: "num counted-burst" }, formatNumber(holder.counted_burst)),
          el("td", { class: "expires", title: holder.expires_at || "" }, fromNow(holder.expires_at)),
          el("td", { class: "closed" }, holder.closed ? "closed" : "open")));
      });
    }
    $("quota-buckets").tBodies[0].replaceWith(body);
  }

  async function refresh() {
    // One refresh at a time: a slow replica must not pile requests up.
    if (pending) return pending;
    pending = (async () => {
      try {
        const status = await api("/v1/status");
        renderStatus(status);
        const key = $("key").value.trim();
        if (key) {
          const fill = await api("/v1/fill/" + encodeURIComponent(key));
          renderFill(fill);
          const limits = await api("/v1/domains/" + encodeURIComponent(fill.domain_id) + "/limits");
          renderLimits(limits, fill.kind);
        } else {
          $("subject").hidden = true;
        }
        const service = $("service").value.trim();
        if (service) {
          await renderService(service);
          await renderQuota(service);
        } else {
          $("service-view").hidden = true;
        }
        showError(null);
        setText("refreshed", "last at " + new Date().toISOString());
        document.body.dataset.state = "ready";
      } catch (error) {
        if (error instanceof ApiError && error.status === 401) {
          lock("That token was refused (" + error.code + "). Enter an operator token.");
        } else {
          showError(error);
          document.body.dataset.state = "error";
        }
      } finally {
        pending = null;
      }
    })();
    return pending;
  }

  function open() {
    $("token-form").hidden = true;
    $("main").hidden = false;
    $("lock").hidden = false;
    document.body.dataset.state = "loading";
    refresh();
    if (!timer) timer = setInterval(refresh, REFRESH_MS);
  }

  document.addEventListener("DOMContentLoaded", () => {
    const { key, service } = readFragment();
    if (key) $("key").value = key;
    if (service) $("service").value = service;
    $("token-form").addEventListener("submit", (event) => {
      event.preventDefault();
      sessionStorage.setItem(TOKEN_KEY, $("token").value);
      $("token").value = "";
      open();
    });
    $("key-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const value = $("key").value.trim();
      history.replaceState(null, "", window.location.pathname + (value ? "#key=" + encodeURIComponent(value) : ""));
      refresh();
    });
    $("service-form").addEventListener("submit", (event) => {
      event.preventDefault();
      refresh();
    });
    $("lock").addEventListener("click", () => lock(null));
    if (sessionStorage.getItem(TOKEN_KEY)) open();
  });
})();
