/* The what-if page of `meshplan serve`. Plain script, no build step; charts come from charts.js. */
(function () {
  "use strict";

  var C = window.meshplanCharts;
  var $ = function (id) { return document.getElementById(id); };
  var esc = C.escapeHtml;

  var FIELDS = ["model", "accelerator", "nodes", "gpus_per_node", "inter_node_gb_per_s", "batch_tokens", "seq_len",
    "optimizer", "precision", "software", "space", "train_tokens"];
  var URL_KEYS = {model: "model", accelerator: "accel", nodes: "nodes", gpus_per_node: "gpn",
    inter_node_gb_per_s: "bw", batch_tokens: "batch", seq_len: "seq", optimizer: "opt", precision: "prec",
    software: "stack", space: "space", train_tokens: "tokens"};
  var NODE_STEPS = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096];
  var BW_STEPS = [1.5625, 3.125, 6.25, 12.5, 25, 50, 100, 200, 400];
  var SEQ_STEPS = [];
  for (var k = 7; k <= 20; k++) SEQ_STEPS.push(Math.pow(2, k));
  var PAGE = 50;

  var S = {
    catalog: null, uploads: {model: null, job: null}, current: null, previous: null, selected: null,
    detail: null, sort: {key: "rank", dir: "asc"}, shown: PAGE, shownInfeasible: 20, seq: 0, condSeq: 0,
    detailSeq: 0, controller: null, condController: null, timer: null, conditions: null
  };
  window.meshplanPage = S;  // for the browser tests and the curious

  // ---- formatting ----------------------------------------------------------------------------------------
  function tokens(n) {
    var units = [[Math.pow(2, 30), "G"], [Math.pow(2, 20), "M"], [Math.pow(2, 10), "K"]];
    for (var i = 0; i < units.length; i++) {
      if (n >= units[i][0] && n % (units[i][0] / 1024) === 0) {
        return String(+(n / units[i][0]).toPrecision(4)) + units[i][1];
      }
    }
    return n.toLocaleString("en-US");
  }
  function parseTokens(text) {
    var t = String(text).trim().toUpperCase().replace(/,/g, "").replace(/_/g, "");
    var m = /^(\d+(?:\.\d+)?)([KMG]?)$/.exec(t);
    if (!m) return null;
    var mult = {"": 1, K: 1024, M: 1048576, G: 1073741824}[m[2]];
    var v = parseFloat(m[1]) * mult;
    return Number.isInteger(v) && v > 0 ? v : null;
  }
  /* A token budget as people write it, in decimal multiples: '15.6T', '2e12', '300B'. */
  function parseBudget(text) {
    var t = String(text).trim().toUpperCase().replace(/,/g, "").replace(/_/g, "");
    if (!t) return null;
    var m = /^(\d+(?:\.\d+)?(?:E\d+)?)([KMBGT]?)$/.exec(t);
    if (!m) return NaN;
    var v = Math.round(parseFloat(m[1]) * {"": 1, K: 1e3, M: 1e6, B: 1e9, G: 1e9, T: 1e12}[m[2]]);
    return v >= 1 ? v : NaN;
  }
  function budget(n) {
    if (n >= 1e12) return +(n / 1e12).toPrecision(4) + "T";
    if (n >= 1e9) return +(n / 1e9).toPrecision(4) + "B";
    return n.toLocaleString("en-US");
  }
  var GiB = Math.pow(2, 30);
  function gib(b) { return C.formatGiB(b / GiB); }
  function pct(x) { return x === null || x === undefined ? "-" : (x * 100).toFixed(1) + "%"; }
  function int(x) { return x === null || x === undefined ? "-" : Math.round(x).toLocaleString("en-US"); }
  function params(n) { return n >= 1e9 ? (n / 1e9).toFixed(1) + "B" : (n / 1e6).toFixed(0) + "M"; }

  // ---- status and errors -------------------------------------------------------------------------------------
  function status(text, state) {
    var el = $("status");
    el.textContent = text;
    el.classList.toggle("busy", state === "busy");
    document.body.dataset.state = state;
  }
  function showError(err) {
    var box = $("error");
    if (!err) { box.hidden = true; box.innerHTML = ""; return; }
    box.hidden = false;
    box.innerHTML = (err.field ? "<b>" + esc(err.field) + "</b>: " : "") + esc(err.message);
  }

  async function post(path, body, controller) {
    var resp;
    try {
      resp = await fetch(path, {method: "POST", headers: {"Content-Type": "application/json"},
        body: JSON.stringify(body), signal: controller ? controller.signal : undefined});
    } catch (e) {
      if (e.name === "AbortError") throw e;
      throw {field: "server", message: "the server did not answer (is `meshplan serve` still running?)"};
    }
    var data = null;
    try { data = await resp.json(); } catch (e) { data = null; }
    if (!resp.ok) {
      throw (data && data.error) || {field: "server", message: "HTTP " + resp.status};
    }
    return data;
  }

  // ---- controls ----------------------------------------------------------------------------------------------
  function fillSelect(el, values, labels) {
    el.innerHTML = values.map(function (v, i) {
      return "<option value='" + esc(v) + "'>" + esc(labels ? labels[i] : v) + "</option>";
    }).join("");
  }

  function nearestIndex(list, v) {
    var best = 0;
    for (var i = 1; i < list.length; i++) {
      if (Math.abs(Math.log(list[i] / v)) < Math.abs(Math.log(list[best] / v))) best = i;
    }
    return best;
  }

  function accelerator() {
    var name = $("accelerator").value;
    return S.catalog.accelerators.filter(function (a) { return a.name === name; })[0];
  }

  function batchSteps() {
    var seq = parseTokens($("seq").value) || 4096;
    var out = [];
    for (var j = 0; j <= 22; j++) out.push(seq * Math.pow(2, j));
    return out;
  }

  function syncSliders() {
    var a = accelerator();
    var nodes = parseInt($("nodes").value, 10) || 1;
    $("nodes-range").max = NODE_STEPS.length - 1;
    $("nodes-range").value = nearestIndex(NODE_STEPS, nodes);
    var bw = parseFloat($("bandwidth").value) || (a ? a.inter_node_bytes_per_s / 1e9 : 50);
    $("bandwidth-range").max = BW_STEPS.length - 1;
    $("bandwidth-range").value = nearestIndex(BW_STEPS, bw);
    $("bandwidth").placeholder = a ? String(a.inter_node_bytes_per_s / 1e9) : "node's";
    var steps = batchSteps();
    $("batch-range").max = steps.length - 1;
    $("batch-range").value = nearestIndex(steps, parseTokens($("batch").value) || steps[10]);
    $("seq-range").max = SEQ_STEPS.length - 1;
    $("seq-range").value = nearestIndex(SEQ_STEPS, parseTokens($("seq").value) || 4096);
    var gpn = parseInt($("gpus-per-node").value, 10) || (a ? a.gpus_per_node : 8);
    $("gpus-per-node").placeholder = a ? String(a.gpus_per_node) : "node's";
    $("gpu-count").textContent = "= " + (nodes * gpn).toLocaleString("en-US") + " GPUs" +
      (a ? " · " + C.formatGiB(a.hbm_capacity_bytes / GiB) + " HBM each" : "");
  }

  function readControls() {
    var s = {};
    s.model = S.uploads.model ? null : $("model").value;
    s.accelerator = $("accelerator").value;
    s.nodes = parseInt($("nodes").value, 10);
    var gpn = $("gpus-per-node").value.trim();
    s.gpus_per_node = gpn === "" ? null : parseInt(gpn, 10);
    var bw = $("bandwidth").value.trim();
    s.inter_node_gb_per_s = bw === "" ? null : parseFloat(bw);
    s.batch_tokens = parseTokens($("batch").value);
    s.seq_len = parseTokens($("seq").value);
    s.optimizer = $("optimizer").value;
    s.precision = $("precision").value;
    s.software = $("software").value;
    s.space = $("space").value;
    s.train_tokens = S.catalog.panels.economics ? parseBudget($("train-tokens").value) : null;
    s.model_spec = S.uploads.model;
    s.job_spec = S.uploads.job;
    return s;
  }

  function checkControls(s) {
    if (!s.batch_tokens) return {field: "batch_tokens", message: "a whole number of tokens, e.g. 4194304 or 4M"};
    if (!s.seq_len) return {field: "seq_len", message: "a whole number of tokens, e.g. 4096 or 8K"};
    if (!(s.nodes >= 1)) return {field: "nodes", message: "a whole number of nodes, at least 1"};
    if (s.gpus_per_node !== null && !(s.gpus_per_node >= 1)) return {field: "gpus_per_node", message: "at least 1, or empty for the node's"};
    if (s.inter_node_gb_per_s !== null && !(s.inter_node_gb_per_s > 0)) return {field: "inter_node_gb_per_s", message: "a positive number of GB/s, or empty for the node's"};
    if (s.train_tokens !== null && !(s.train_tokens >= 1)) return {field: "train_tokens", message: "a token budget, e.g. 15.6T or 300B, or empty"};
    return null;
  }

  function writeControls(s) {
    if (s.model) $("model").value = s.model;
    $("accelerator").value = s.accelerator;
    $("nodes").value = s.nodes;
    $("gpus-per-node").value = s.gpus_per_node === null || s.gpus_per_node === undefined ? "" : s.gpus_per_node;
    $("bandwidth").value = s.inter_node_gb_per_s === null || s.inter_node_gb_per_s === undefined ? "" : s.inter_node_gb_per_s;
    $("batch").value = tokens(s.batch_tokens);
    $("seq").value = tokens(s.seq_len);
    $("optimizer").value = s.optimizer;
    $("precision").value = s.precision;
    $("software").value = s.software;
    $("space").value = s.space;
    $("train-tokens").value = s.train_tokens ? budget(s.train_tokens) : "";
    S.uploads.model = s.model_spec || null;
    S.uploads.job = s.job_spec || null;
    showUploads();
    syncSliders();
  }

  function showUploads() {
    ["model", "job"].forEach(function (kind) {
      var doc = S.uploads[kind];
      $(kind + "-upload").hidden = !doc;
      $(kind + "-upload-name").textContent = doc ? "using " + doc.name : "";
    });
    $("model").disabled = !!S.uploads.model;
  }

  // ---- the URL ------------------------------------------------------------------------------------------------
  function b64encode(text) {
    var bytes = new TextEncoder().encode(text);
    var bin = "";
    for (var i = 0; i < bytes.length; i++) bin += String.fromCharCode(bytes[i]);
    return btoa(bin).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  }
  function b64decode(text) {
    var bin = atob(text.replace(/-/g, "+").replace(/_/g, "/"));
    var bytes = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    return new TextDecoder().decode(bytes);
  }

  function toQuery(s) {
    var q = new URLSearchParams();
    FIELDS.forEach(function (f) {
      var v = s[f];
      if (v === null || v === undefined) return;
      if (S.catalog && S.catalog.defaults[f] === v && f !== "model" && f !== "accelerator") return;
      q.set(URL_KEYS[f], String(v));
    });
    var long = false;
    ["model", "job"].forEach(function (kind) {
      var doc = s[kind + "_spec"];
      if (!doc) return;
      var enc = b64encode(doc.text);
      if (enc.length > 6000) { long = true; return; }
      q.set(kind + "_spec", enc);
      q.set(kind + "_format", doc.format);
      q.set(kind + "_name", doc.name);
    });
    if (S.selected && S.current && S.current.recommended &&
        S.selected !== S.current.recommended.estimate.plan.string) q.set("plan", S.selected);
    return {query: q.toString(), complete: !long};
  }

  function fromQuery(search) {
    var q = new URLSearchParams(search);
    var s = JSON.parse(JSON.stringify(S.catalog.defaults));
    FIELDS.forEach(function (f) {
      var v = q.get(URL_KEYS[f]);
      if (v === null) return;
      if (["nodes", "gpus_per_node", "batch_tokens", "seq_len"].indexOf(f) >= 0) s[f] = parseTokens(v) || s[f];
      else if (f === "train_tokens") s[f] = parseBudget(v) || null;
      else if (f === "inter_node_gb_per_s") s[f] = parseFloat(v) || null;
      else s[f] = v;
    });
    ["model", "job"].forEach(function (kind) {
      var enc = q.get(kind + "_spec");
      if (!enc) return;
      try {
        s[kind + "_spec"] = {text: b64decode(enc), format: q.get(kind + "_format") || "toml",
          name: q.get(kind + "_name") || ("linked." + (q.get(kind + "_format") || "toml"))};
        if (kind === "model") s.model = null;
      } catch (e) { /* a damaged link: the catalog model stays */ }
    });
    return {scenario: s, plan: q.get("plan")};
  }

  function updateUrl(s) {
    var r = toQuery(s);
    history.replaceState(null, "", r.query ? "?" + r.query : location.pathname);
    $("copy-link").title = r.complete ? "Copy a link that reproduces this view" :
      "Copy a link (an uploaded spec over 4 KiB is not in it)";
  }

  // ---- planning -----------------------------------------------------------------------------------------------
  function schedule() {
    clearTimeout(S.timer);
    S.timer = setTimeout(plan, 350);
  }

  async function plan(force) {
    clearTimeout(S.timer);
    var s = readControls();
    var bad = checkControls(s);
    if (bad) { showError(bad); status("fix the highlighted value", "error"); return; }
    if (force !== true && S.current && !S.controller && JSON.stringify(S.current.request) === JSON.stringify(s)) {
      showError(null);  // nothing changed (a field left without a new value): the answer stands
      status($("status").textContent, "ready");
      return;
    }
    if (S.controller) S.controller.abort();
    var controller = S.controller = new AbortController();
    var seq = ++S.seq;
    status("searching every plan…", "busy");
    var t0 = performance.now();
    try {
      var result = await post("/api/plan", {scenario: s}, controller);
      if (seq !== S.seq) return;
      S.controller = null;
      showError(null);
      var same = S.current && JSON.stringify(S.current.request) === JSON.stringify(s);
      if (S.current && !same) S.previous = S.current;
      result.request = s;
      S.current = result;
      var keep = S.pendingPlan;
      S.pendingPlan = null;
      S.selected = keep || (result.recommended ? result.recommended.estimate.plan.string : null);
      S.shown = PAGE;
      renderAll();
      updateUrl(s);
      status("planned " + result.search.n_plans.toLocaleString("en-US") + " plans in " +
        ((performance.now() - t0) / 1000).toFixed(1) + " s", "ready");
      if (keep) selectPlan(keep);
      loadConditions(s);
    } catch (e) {
      if (e && e.name === "AbortError") return;
      if (seq !== S.seq) return;
      S.controller = null;
      showError(e);
      status("the last change was not planned (see the message)", "error");
    }
  }

  async function loadConditions(s) {
    if (S.condController) S.condController.abort();
    var controller = S.condController = new AbortController();
    var seq = ++S.condSeq;
    S.conditions = null;
    $("conditions").innerHTML = "";
    $("held").textContent = "";
    if (!S.current.recommended) {
      $("conditions-status").textContent = "no plan fits, so there is no recommendation to change";
      return;
    }
    $("conditions-status").innerHTML = "<span class='spinner-inline'></span>re-running the search while the global " +
      "batch, inter-node bandwidth, GPU count, sequence length and depth vary (a series of searches; up to " +
      Math.round(S.catalog.limits.conditions_time_limit_s) + " s)…";
    try {
      var r = await post("/api/conditions", {scenario: s}, controller);
      if (seq !== S.condSeq) return;
      S.conditions = r;
      renderConditions(r);
    } catch (e) {
      if (e && e.name === "AbortError") return;
      if (seq !== S.condSeq) return;
      $("conditions-status").textContent = "not computed: " + (e.message || e);
    }
  }

  async function selectPlan(planString) {
    S.selected = planString;
    renderTable();
    renderCharts();
    var rec = S.current.recommended;
    if (rec && planString === rec.estimate.plan.string) {
      S.detail = rec;
      renderDetail();
      updateUrl(S.current.request);
      return;
    }
    var seq = ++S.detailSeq;
    $("selected-status").innerHTML = "<span class='spinner-inline'></span>evaluating " + esc(planString) + "…";
    try {
      var d = await post("/api/evaluate", {scenario: evaluationScenario(), plan: planString});
      if (seq !== S.detailSeq) return;
      S.detail = d;
      renderDetail();
      updateUrl(S.current.request);
    } catch (e) {
      if (seq !== S.detailSeq) return;
      $("selected-status").textContent = "";
      showError(e);
    }
  }

  // ---- rendering ----------------------------------------------------------------------------------------------
  function renderAll() {
    renderRecommendation();
    renderPrevious();
    renderReasons();
    renderCharts();
    renderTable();
    renderInfeasible();
    renderQuestions();
    renderEconomics();
    S.detail = S.current.recommended;
    renderDetail();
    document.body.dataset.renders = String((parseInt(document.body.dataset.renders || "0", 10)) + 1);
  }

  function scenarioLine(sc) {
    return (sc.uploaded_model ? sc.model_name + " (uploaded)" : sc.model_name) + " · " + params(sc.params) +
      " parameters" + (sc.moe ? " (" + params(sc.active_params) + " active)" : "") + " · " +
      sc.n_gpus.toLocaleString("en-US") + " × " + sc.accelerator + " (" + sc.n_nodes + " × " + sc.gpus_per_node +
      ") · " + tokens(sc.global_batch_tokens) + " tokens per step · sequence " + sc.seq_len.toLocaleString("en-US") +
      " · " + (sc.inter_node_bytes_per_s / 1e9) + " GB/s per GPU between nodes";
  }

  function renderRecommendation() {
    var r = S.current, rec = r.recommended;
    $("rec-scenario").textContent = scenarioLine(r.scenario);
    if (!rec) {
      $("rec-plan").textContent = "No plan fits";
      $("rec-plan").dataset.plan = "";
      $("rec-string").textContent = "every plan searched needs more memory than the GPU has, or cannot split the batch";
      ["rec-step", "rec-mfu", "rec-tps", "rec-mem", "rec-band"].forEach(function (id) { $(id).textContent = ""; });
      $("rec-step").dataset.step = "";
      return;
    }
    var e = rec.estimate;
    $("rec-plan").textContent = e.plan.label;
    $("rec-plan").dataset.plan = e.plan.string;
    $("rec-string").textContent = e.plan.string;
    $("rec-step").textContent = C.formatSeconds(e.step_time_s);
    $("rec-step").dataset.step = String(e.step_time_s);
    $("rec-band").textContent = e.uncertainty ?
      "measured runs: " + signed(e.uncertainty.low) + " … " + signed(e.uncertainty.high) : "";
    $("rec-band").title = rec.band || "";
    $("rec-mfu").textContent = pct(e.mfu);
    $("rec-tps").textContent = int(e.tokens_per_s_per_gpu);
    $("rec-mem").textContent = gib(e.memory.peak_bytes) + " / " + gib(e.memory.capacity_bytes);
  }
  function signed(x) { return (x >= 0 ? "+" : "−") + Math.abs(x * 100).toFixed(0) + "%"; }

  var DIFF_NAMES = {model: "model", accelerator: "accelerator", nodes: "nodes", gpus_per_node: "GPUs per node",
    inter_node_gb_per_s: "inter-node GB/s", batch_tokens: "global batch", seq_len: "sequence", optimizer: "optimizer",
    precision: "precision", software: "stack", space: "space", train_tokens: "tokens to train"};

  function scenarioDiff(a, b) {
    var out = [];
    FIELDS.forEach(function (f) {
      if (JSON.stringify(a[f]) === JSON.stringify(b[f])) return;
      var show = function (v) {
        if (v === null || v === undefined) return f === "train_tokens" ? "none" : "node's";
        if (f === "train_tokens") return budget(v);
        return (f === "batch_tokens" || f === "seq_len") ? tokens(v) : String(v);
      };
      out.push(DIFF_NAMES[f] + " " + show(a[f]) + " → " + show(b[f]));
    });
    ["model_spec", "job_spec"].forEach(function (f) {
      if (JSON.stringify(a[f]) !== JSON.stringify(b[f])) out.push(f.replace("_spec", " spec") + " changed");
    });
    return out;
  }

  function renderPrevious() {
    var p = S.previous, c = S.current;
    $("prev-card").hidden = !p;
    document.querySelector(".cards").classList.toggle("single", !p);
    if (!p) return;
    var diff = scenarioDiff(p.request, c.request);
    $("prev-diff").innerHTML = diff.length ? "now: " + diff.map(function (d) { return "<span class='changed'>" + esc(d) + "</span>"; }).join(" ") : "";
    var pe = p.recommended ? p.recommended.estimate : null;
    var ce = c.recommended ? c.recommended.estimate : null;
    $("prev-plan").textContent = pe ? pe.plan.label : "No plan fit";
    $("prev-plan").dataset.plan = pe ? pe.plan.string : "";
    $("prev-step").textContent = pe ? C.formatSeconds(pe.step_time_s) : "-";
    $("prev-mfu").textContent = pe ? pct(pe.mfu) : "-";
    $("prev-mem").textContent = pe ? gib(pe.memory.peak_bytes) : "-";
    var d = $("prev-step-delta");
    d.className = "delta";
    d.textContent = "";
    if (pe && ce) {
      var ratio = ce.step_time_s / pe.step_time_s - 1;
      var perTok = (ce.step_time_s / ce.global_batch_tokens) / (pe.step_time_s / pe.global_batch_tokens) - 1;
      d.textContent = "now " + (ratio >= 0 ? "+" : "") + (ratio * 100).toFixed(1) + "% per step" +
        (pe.global_batch_tokens !== ce.global_batch_tokens ? ", " + (perTok >= 0 ? "+" : "") + (perTok * 100).toFixed(1) + "% per token" : "");
      d.classList.add(perTok > 0.0005 ? "up" : perTok < -0.0005 ? "down" : "same");
    }
  }

  function stackItems(r) {
    // a scenario that names no stack: each stack's best plan, and the one the recommendation assumes
    if (!r.stacks || !r.stacks.length) return [];
    var parts = r.stacks.map(function (st) {
      if (!st.best) return esc(st.name) + ": no plan (" + esc(st.why_none) + ")";
      var b = st.best.band ? " (" + signedPct(st.best.band.low) + " .. " + signedPct(st.best.band.high) + ")" : "";
      return esc(st.name) + ": " + esc(st.best.label) + ", " + st.best.step_time_s.toFixed(2) + " s" + b;
    });
    var a = r.assumed_stack;
    return ["<li class='stacks'><b>Software stacks</b> (none named; fastest first): " + parts.join("; ") +
            (a ? ". <b>Assumed:</b> " + esc(a.stack) + " (" + esc(a.why) + "); choose another under stack." : "") +
            "</li>"];
  }

  function signedPct(x) {
    return (x >= 0 ? "+" : "") + Math.round(x * 100) + "%";
  }

  function evaluationScenario() {
    // a plan picked from the table is timed on the stack its ranking assumed
    var req = Object.assign({}, S.current.request);
    if (S.current.assumed_stack) req.software = S.current.assumed_stack.stack;
    return req;
  }

  function renderReasons() {
    var r = S.current;
    var q4 = r.questions[r.questions.length - 1];
    var lines = q4 ? q4.lines : [];
    var rec = r.recommended;
    var items = stackItems(r);
    lines.forEach(function (l, i) {
      if (i === 0 && rec) return;  // the card above says it
      var m = /^([A-Z][\w -]{0,40}?): (.*)$/.exec(l);
      items.push("<li>" + (m ? "<b>" + esc(m[1]) + ":</b> " + esc(m[2]) : esc(l)) + "</li>");
    });
    $("reasons").innerHTML = items.join("");
    var sr = r.search;
    $("search-summary").textContent = "Searched " + (sr.n_plans + sr.n_pruned).toLocaleString("en-US") + " plans (" +
      sr.n_configurations.toLocaleString("en-US") + " configurations with micro-batch sizes and recompute modes) in " +
      sr.elapsed_s.toFixed(2) + " s: " + sr.n_plans.toLocaleString("en-US") + " evaluated, " +
      sr.n_feasible.toLocaleString("en-US") + " fit; " + sr.n_pruned.toLocaleString("en-US") +
      " option variants pruned. Within " + Math.round(sr.tie_band * 100) + "% of the fastest, plans with fewer axes and options rank first.";
  }

  function ghostRows(kind) {
    var p = S.previous;
    if (!p || !p.recommended) return [];
    var chart = kind === "memory" ? p.recommended.memory_chart : p.recommended.time_chart;
    return chart.rows.map(function (r) {
      return {label: "previous: " + r.label, plan: null, terms: r.terms};
    });
  }

  function renderCharts() {
    var r = S.current;
    var onSelect = function (plan) { if (plan) selectPlan(plan); };
    C.render($("chart-memory"), r.charts.memory, {ghosts: ghostRows("memory"), selected: S.selected, onSelect: onSelect});
    C.render($("chart-time"), r.charts.time, {ghosts: ghostRows("time"), selected: S.selected, onSelect: onSelect});
    C.render($("chart-pareto"), r.charts.pareto, {selected: S.selected, onSelect: onSelect,
      previousFront: S.previous ? S.previous.charts.pareto.front : null});
  }

  function filteredPlans() {
    var fam = $("filter-family").value, stack = $("filter-stack").value;
    var text = $("filter-text").value.trim().toLowerCase();
    var rows = S.current.plans.filter(function (p) {
      return p.feasible && (!fam || p.family === fam) && (!stack || p.stack === stack) &&
        (!text || (p.label + " " + p.plan + " " + p.options).toLowerCase().indexOf(text) >= 0);
    });
    var key = S.sort.key, dir = S.sort.dir === "asc" ? 1 : -1;
    rows.sort(function (a, b) {
      var x = a[key], y = b[key];
      if (x === y) return a.rank - b.rank;
      if (x === null || x === undefined) return 1;
      if (y === null || y === undefined) return -1;
      return (x < y ? -1 : 1) * dir;
    });
    return rows;
  }

  function fillFilters() {
    var plans = S.current.plans;
    [["filter-family", "family", "family_name"], ["filter-stack", "stack", "stack"]].forEach(function (f) {
      var el = $(f[0]), keep = el.value, seen = {};
      var opts = ["<option value=''>all</option>"];
      plans.forEach(function (p) {
        if (!seen[p[f[1]]]) { seen[p[f[1]]] = true; opts.push("<option value='" + esc(p[f[1]]) + "'>" + esc(p[f[2]]) + "</option>"); }
      });
      el.innerHTML = opts.join("");
      el.value = seen[keep] ? keep : "";
    });
  }

  function renderTable() {
    if (!S.current) return;
    if (!S.filtersFor || S.filtersFor !== S.current) { fillFilters(); S.filtersFor = S.current; }
    var rows = filteredPlans();
    var rec = S.current.recommended ? S.current.recommended.estimate.plan.string : null;
    var shown = rows.slice(0, S.shown);
    $("plans").querySelector("tbody").innerHTML = shown.map(function (p) {
      var cls = (p.plan === rec ? "recommended " : "") + (p.plan === S.selected ? "selected" : "");
      return "<tr class='" + cls + "' data-plan='" + esc(p.plan) + "' data-rank='" + p.rank + "' data-family='" +
        esc(p.family) + "' data-stack='" + esc(p.stack) + "' data-step='" +
        (p.step_time_s === null ? "" : p.step_time_s) + "'>" +
        "<td class='num'>" + p.rank + "</td>" +
        "<td class='wrap'><b>" + esc(p.label) + "</b></td>" +
        "<td><span class='tag " + esc(p.stack) + "'>" + esc(p.stack) + "</span></td>" +
        "<td class='opt wrap'>" + esc(p.options) + "</td>" +
        "<td class='num'>" + p.mbs + " × " + p.n_microbatches + ", " + esc(p.recompute) + "</td>" +
        "<td class='num'>" + C.formatSeconds(p.step_time_s) + (p.simulated ? "" : "<span class='dim' title='closed form; the simulator re-times the leading plans'>*</span>") + "</td>" +
        "<td class='num'>" + pct(p.mfu) + "</td>" +
        "<td class='num'>" + int(p.tokens_per_s_per_gpu) + "</td>" +
        "<td class='num'>" + C.formatSeconds(p.exposed_comm_s) + "</td>" +
        "<td class='num'>" + gib(p.peak_bytes) + "</td></tr>";
    }).join("");
    $("more-plans").hidden = rows.length <= S.shown;
    $("table-note").textContent = "Showing " + shown.length.toLocaleString("en-US") + " of " +
      rows.length.toLocaleString("en-US") + " plans that fit" + (rows.length < S.current.search.n_feasible ? " (filtered)" : "") +
      ". * closed form (the simulator re-times the leading plans and any plan you open). Click a row to inspect it.";
    Array.prototype.forEach.call($("plans").querySelectorAll("th"), function (th) {
      th.dataset.sort = th.dataset.key === S.sort.key ? S.sort.dir : "";
    });
  }

  function renderInfeasible() {
    var rows = S.current.plans.filter(function (p) { return !p.feasible; });
    $("infeasible-title").textContent = rows.length.toLocaleString("en-US") + " plan" + (rows.length === 1 ? "" : "s") +
      " that do not fit, closest to fitting first";
    $("infeasible").querySelector("tbody").innerHTML = rows.slice(0, S.shownInfeasible).map(function (p) {
      return "<tr data-plan='" + esc(p.plan) + "'><td class='wrap plan-cell'><b>" + esc(p.label) + "</b><div class='mono dim'>" + esc(p.plan) +
        "</div></td><td><span class='tag " + esc(p.stack) + "'>" + esc(p.stack) + "</span></td><td class='num'>" +
        gib(p.peak_bytes) + "</td><td class='reason'>" + p.reasons.map(esc).join("<br>") + "</td></tr>";
    }).join("");
    $("more-infeasible").hidden = rows.length <= S.shownInfeasible;
  }

  function renderQuestions() {
    $("questions").innerHTML = S.current.questions.map(function (q, i) {
      return "<div class='question'><h3>" + (i + 1) + ". " + esc(q.title) + "</h3><ul class='reasons small'>" +
        q.lines.map(function (l) { return "<li>" + esc(l) + "</li>"; }).join("") + "</ul></div>";
    }).join("");
    renderMeasure(S.current.measure_first);
  }

  function renderMeasure(list) {
    $("measure").innerHTML = (list || []).map(function (m) {
      return "<li><b>" + esc(m.what) + "</b>: " + esc(m.why) + "</li>";
    }).join("");
  }

  function renderConditions(r) {
    $("conditions-status").textContent = r.conditions.length ? "Computed by re-running the search at other values:" :
      (r.swept ? "No condition swept changes the recommendation." : "Not computed.");
    $("conditions").innerHTML = r.conditions.map(function (c) {
      return "<li data-condition='" + esc(c.condition) + "'>" + esc(c.text) + "</li>";
    }).join("");
    $("held").textContent = r.held || "";
    renderMeasure(r.measure_first);
  }

  function renderEconomics() {
    var e = S.current.economics;
    $("economics").hidden = !e;
    if (!e) return;
    $("economics-body").innerHTML = e.needs ?
      "<li>Give the tokens to train (left, e.g. 15.6T) for the time to train, GPU-hours, cost, energy and goodput.</li>" :
      e.lines.map(function (l) { return "<li>" + esc(l.trim()) + "</li>"; }).join("");
  }

  function renderDetail() {
    var d = S.detail;
    $("selected-status").textContent = "";
    $("export-text").hidden = true;
    $("export-notes").hidden = true;
    if (!d) {
      $("selected-title").textContent = "Plan in detail";
      $("selected-summary").textContent = "no plan fits: nothing to lay out";
      C.render($("chart-timeline"), {kind: "timeline", title: "", lanes: [], ops: []});
      $("exports").hidden = true;
      return;
    }
    var e = d.estimate;
    var isRec = S.current.recommended && e.plan.string === S.current.recommended.estimate.plan.string;
    $("selected-title").textContent = (isRec ? "Recommended plan" : "Selected plan") + ": " + e.plan.label;
    $("selected-title").dataset.plan = e.plan.string;
    var parts = ["<span class='mono'>" + esc(e.plan.string) + "</span>"];
    if (e.feasible) {
      parts.push("step <b>" + C.formatSeconds(e.step_time_s) + "</b>, MFU " + pct(e.mfu) + ", peak " +
        gib(e.memory.peak_bytes) + " of " + gib(e.memory.capacity_bytes) + " (stage " + e.memory.stage + ")");
      if (d.binding) parts.push("limited by: " + esc(d.binding));
      if (d.band) parts.push(esc(d.band));
    } else {
      parts.push("<span class='reason' style='color:var(--bad)'>does not fit: " + e.infeasible_reasons.map(esc).join("; ") + "</span>");
    }
    if (d.stack_note) parts.push(esc(d.stack_note));
    e.notes.forEach(function (n) { parts.push("<span class='dim'>note: " + esc(n) + "</span>"); });
    $("selected-summary").innerHTML = parts.map(function (p) { return "<div>" + p + "</div>"; }).join("");
    var tl = d.timeline;
    var el = $("chart-timeline");
    if (tl) {
      el.style.height = Math.max(260, Math.min(900, 26 * tl.lanes.length + 130)) + "px";
      C.render(el, tl);
      $("timeline-note").textContent = (tl.note ? tl.note[0].toUpperCase() + tl.note.slice(1) + ". " : "") + (tl.dropped ? tl.dropped.toLocaleString("en-US") +
        " later bars are left out (the earliest of each lane are drawn). " : "") + "Drag the slider or scroll to zoom.";
    } else {
      el.style.height = "120px";
      C.render(el, {kind: "timeline", title: "No simulated timeline for this plan", lanes: [], ops: []});
      $("timeline-note").textContent = e.feasible ? "the simulator does not lay out this plan (too many pipeline passes)" :
        "a plan that does not fit is not timed";
    }
    $("selected-comm").innerHTML = commTable(e);
    var ex = (S.catalog.panels.exports || []).length && d.exports && d.exports.length ? d.exports : null;
    $("exports").hidden = !ex;
    if (ex) {
      $("export-buttons").innerHTML = ex.map(function (f) {
        return "<button type='button' class='ghost' data-framework='" + esc(f) + "'>" + esc(f) + "</button>";
      }).join("");
    }
  }

  function commTable(e) {
    if (!e.comm.length) return "<p class='dim small'>no collectives</p>";
    return "<table class='plans'><thead><tr><th>collective</th><th>axis</th><th>link</th><th class='num'>GPUs</th>" +
      "<th class='num'>calls</th><th class='num'>GB per GPU</th><th class='num'>time</th><th class='num'>exposed</th>" +
      "<th>what</th></tr></thead><tbody>" + e.comm.map(function (c) {
        return "<tr><td>" + esc(c.collective) + "</td><td>" + esc(c.axis) + "</td><td>" + esc(c.link) + "</td><td class='num'>" +
          c.group_size + "</td><td class='num'>" + c.count.toLocaleString("en-US") + "</td><td class='num'>" +
          (c.bytes_per_gpu / 1e9).toFixed(2) + "</td><td class='num'>" + C.formatSeconds(c.time_s) + "</td><td class='num'>" +
          C.formatSeconds(c.exposed_s) + "</td><td class='dim'>" + esc(c.purpose) + "</td></tr>";
      }).join("") + "</tbody></table>";
  }

  // ---- uploads ------------------------------------------------------------------------------------------------
  async function upload(kind, file) {
    if (!file) return;
    var limit = S.catalog.limits.max_spec_chars;
    if (file.size > limit * 4) {
      showError({field: kind + "_spec", message: "the file is " + file.size.toLocaleString("en-US") +
        " bytes; spec documents of at most " + limit.toLocaleString("en-US") + " characters are accepted"});
      return;
    }
    var text = await file.text();
    var fmt = /\.json$/i.test(file.name) || text.trim().charAt(0) === "{" ? "json" : "toml";
    var doc = {format: fmt, text: text, name: file.name.slice(0, 200)};
    try {
      var info = await post("/api/spec", {kind: kind, doc: doc});
      showError(null);
      S.uploads[kind] = doc;
      if (kind === "model") {
        $("model-info").textContent = info.name + ": " + params(info.params) + " parameters, " + info.n_layers + " layers" +
          (info.moe ? ", MoE (" + params(info.active_params) + " active)" : "");
      } else {
        $("batch").value = tokens(info.batch_tokens);
        $("seq").value = tokens(info.seq_len);
        $("optimizer").value = info.optimizer;
        $("precision").value = info.precision;
        $("software").value = info.software;
      }
      showUploads();
      syncSliders();
      plan();
    } catch (e) {
      showError(e);
      status("the uploaded spec was not used (see the message)", "error");
    }
  }

  // ---- wiring -------------------------------------------------------------------------------------------------
  function wire() {
    $("scenario").addEventListener("submit", function (ev) { ev.preventDefault(); plan(true); });
    ["model", "accelerator", "optimizer", "precision", "software", "space"].forEach(function (id) {
      $(id).addEventListener("change", function () { syncSliders(); schedule(); });
    });
    ["nodes", "gpus-per-node", "bandwidth", "batch", "seq", "train-tokens"].forEach(function (id) {
      $(id).addEventListener("change", function () {
        if (id === "seq") {  // keep the batch a whole number of sequences
          var seq = parseTokens($("seq").value), b = parseTokens($("batch").value);
          if (seq && b && b % seq) $("batch").value = tokens(Math.max(seq, Math.round(b / seq) * seq));
        }
        syncSliders();
        schedule();
      });
    });
    var slide = function (rangeId, inputId, values, fmt) {
      var r = $(rangeId);
      r.addEventListener("input", function () { $(inputId).value = fmt(values()[+r.value]); syncLabel(); });
      r.addEventListener("change", function () { $(inputId).value = fmt(values()[+r.value]); syncSliders(); schedule(); });
    };
    var syncLabel = function () {
      var a = accelerator();
      var gpn = parseInt($("gpus-per-node").value, 10) || (a ? a.gpus_per_node : 8);
      $("gpu-count").textContent = "= " + ((parseInt($("nodes").value, 10) || 1) * gpn).toLocaleString("en-US") + " GPUs";
    };
    slide("nodes-range", "nodes", function () { return NODE_STEPS; }, String);
    slide("bandwidth-range", "bandwidth", function () { return BW_STEPS; }, String);
    slide("batch-range", "batch", batchSteps, tokens);
    slide("seq-range", "seq", function () { return SEQ_STEPS; }, tokens);
    $("seq-range").addEventListener("change", function () {
      var seq = parseTokens($("seq").value), b = parseTokens($("batch").value);
      if (seq && b && b % seq) $("batch").value = tokens(Math.max(seq, Math.round(b / seq) * seq));
      syncSliders();
    });
    $("model-file").addEventListener("change", function (ev) { upload("model", ev.target.files[0]); ev.target.value = ""; });
    $("job-file").addEventListener("change", function (ev) { upload("job", ev.target.files[0]); ev.target.value = ""; });
    $("model-upload-clear").addEventListener("click", function () { S.uploads.model = null; $("model-info").textContent = ""; showUploads(); plan(); });
    $("job-upload-clear").addEventListener("click", function () { S.uploads.job = null; showUploads(); plan(); });
    $("reset").addEventListener("click", function () {
      $("model-info").textContent = "";
      writeControls(JSON.parse(JSON.stringify(S.catalog.defaults)));
      plan();
    });
    $("prev-restore").addEventListener("click", function () {
      if (!S.previous) return;
      writeControls(S.previous.request);
      plan();
    });
    $("copy-link").addEventListener("click", function () {
      var text = location.href;
      var done = function () { status("link copied", document.body.dataset.state === "busy" ? "busy" : "ready"); };
      if (navigator.clipboard && navigator.clipboard.writeText) navigator.clipboard.writeText(text).then(done, function () { window.prompt("Copy this link", text); });
      else window.prompt("Copy this link", text);
    });
    $("plans").querySelector("thead").addEventListener("click", function (ev) {
      var th = ev.target.closest("th");
      if (!th || !th.dataset.key) return;
      var key = th.dataset.key;
      S.sort = {key: key, dir: S.sort.key === key && S.sort.dir === "asc" ? "desc" : "asc"};
      renderTable();
    });
    $("plans").querySelector("tbody").addEventListener("click", function (ev) {
      var tr = ev.target.closest("tr");
      if (tr && tr.dataset.plan) selectPlan(tr.dataset.plan);
    });
    $("infeasible").querySelector("tbody").addEventListener("click", function (ev) {
      var tr = ev.target.closest("tr");
      if (tr && tr.dataset.plan) selectPlan(tr.dataset.plan);
    });
    ["filter-family", "filter-stack"].forEach(function (id) {
      $(id).addEventListener("change", function () { S.shown = PAGE; renderTable(); });
    });
    $("filter-text").addEventListener("input", function () { S.shown = PAGE; renderTable(); });
    $("more-plans").addEventListener("click", function () { S.shown += 100; renderTable(); });
    $("more-infeasible").addEventListener("click", function () { S.shownInfeasible += 50; renderInfeasible(); });
    $("export-buttons").addEventListener("click", async function (ev) {
      var b = ev.target.closest("button");
      if (!b) return;
      try {
        var r = await post("/api/export", {scenario: S.current.request, plan: S.detail.estimate.plan.string, framework: b.dataset.framework});
        $("export-text").textContent = r.text;
        $("export-text").hidden = false;
        $("export-notes").innerHTML = (r.assumptions || []).map(function (a) { return "<li>" + esc(a) + "</li>"; }).join("");
        $("export-notes").hidden = !(r.assumptions || []).length;
      } catch (e) {  // a framework that cannot run the plan says what it lacks, here
        $("export-text").textContent = "Not exported: " + (e.message || String(e));
        $("export-text").hidden = false;
        $("export-notes").hidden = true;
      }
    });
  }

  async function init() {
    document.body.dataset.renders = "0";
    try {
      var resp = await fetch("/api/catalog");
      S.catalog = await resp.json();
    } catch (e) {
      status("the catalog could not be loaded", "error");
      showError({field: "server", message: "the server did not answer"});
      return;
    }
    var cat = S.catalog;
    fillSelect($("model"), cat.models.map(function (m) { return m.name; }), cat.models.map(function (m) {
      return m.name + " (" + params(m.params) + ")";
    }));
    fillSelect($("accelerator"), cat.accelerators.map(function (a) { return a.name; }));
    fillSelect($("optimizer"), cat.optimizers);
    fillSelect($("precision"), cat.precisions);
    fillSelect($("software"), cat.software);
    $("train-tokens-row").hidden = !cat.panels.economics;
    var fromUrl = fromQuery(location.search);
    writeControls(fromUrl.scenario);
    S.pendingPlan = fromUrl.plan;
    wire();
    plan();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
