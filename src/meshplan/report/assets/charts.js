/* meshplan's interactive charts, drawn with Apache ECharts (echarts.min.js, vendored beside this file).
 *
 * Shared by the HTML report (`meshplan report`, which inlines both files) and the page of `meshplan serve`.
 * Each chart is drawn from a data dict that meshplan/report/chartdata.py builds ("kind": memory, time,
 * pareto, sweep or timeline); units are in the data's keys (GiB, seconds, milliseconds).
 *
 *   meshplanCharts.render(element, data, options) -> the ECharts instance
 *
 * options: {ghosts: [rows]} extra bars drawn faded (the previous answer, memory and time charts);
 *          {previousFront: [[step_s, headroom_gib, label, plan], ...]} (pareto);
 *          {selected: plan string} a plan to mark (pareto, memory, time);
 *          {onSelect: function (planString)} called when a bar or point of a plan is clicked.
 */
(function (root) {
  "use strict";

  var PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac", "#1f77b4", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#aec7e8"];
  var FIXED = {  // the terms a reader compares across charts keep one colour
    "compute": "#4e79a7", "recompute": "#a0cbe8", "pipeline bubble": "#bab0ac", "optimizer step": "#9c755f",
    "step overhead": "#d4a6c8", "comm contention": "#f1ce63",
    "params": "#4e79a7", "grads": "#f28e2b", "master_params": "#59a14f", "optimizer_state": "#76b7b2",
    "activations": "#e15759", "cuda_context": "#bab0ac", "nccl_buffers": "#9c755f",
    "allocator_fragmentation": "#d4a6c8",
    "F": "#59a14f", "B": "#f28e2b", "W": "#edc948"
  };
  var assigned = {};
  var nextColour = 0;

  function colour(name) {
    if (FIXED[name]) return FIXED[name];
    if (!assigned[name]) {
      assigned[name] = PALETTE[(nextColour + 4) % PALETTE.length];
      nextColour += 1;
    }
    return assigned[name];
  }

  function formatSeconds(t) {
    if (t === null || t === undefined || !isFinite(t)) return "-";
    if (t >= 1) return t.toFixed(2) + " s";
    if (t >= 1e-3) return (t * 1e3).toFixed(1) + " ms";
    return (t * 1e6).toFixed(0) + " us";
  }

  /* Axis ticks: '0', '250 ms', '20 s' (format_seconds' units without its fixed decimals). */
  function axisSeconds(t) {
    if (!t) return "0";
    if (t >= 1) return +t.toPrecision(3) + " s";
    if (t >= 1e-3) return +(t * 1e3).toPrecision(3) + " ms";
    return +(t * 1e6).toPrecision(3) + " us";
  }

  function formatGiB(v) {
    if (v === null || v === undefined || !isFinite(v)) return "-";
    return v.toLocaleString("en-US", {minimumFractionDigits: 1, maximumFractionDigits: 1}) + " GiB";
  }

  function escapeHtml(s) {
    return String(s).replace(/[&<>"']/g, function (c) {
      return {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c];
    });
  }

  var FONT = {fontFamily: "Inter, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif", fontSize: 12, color: "#334"};
  var TOOLBOX = {right: 8, top: 0, feature: {dataZoom: {yAxisIndex: "none", title: {zoom: "zoom", back: "undo zoom"}},
    restore: {title: "reset"}, saveAsImage: {title: "save as PNG", pixelRatio: 2}}};

  function base(title) {
    return {
      textStyle: FONT, animationDuration: 300,
      title: {text: title || "", left: 0, top: 0, textStyle: {fontSize: 13, fontWeight: 600, color: "#223"}},
      toolbox: TOOLBOX,
      tooltip: {confine: true, backgroundColor: "rgba(255,255,255,0.97)", borderColor: "#ccd",
        textStyle: {fontSize: 12, color: "#223"}}
    };
  }

  /* Horizontal stacked bars: one row per plan, one series per term (memory: GiB against the HBM line;
   * time: seconds, the terms summing to the step). */
  function stacked(el, data, opts) {
    var isMemory = data.kind === "memory";
    var fmt = isMemory ? formatGiB : formatSeconds;
    var rows = data.rows.map(function (r) { return {row: r, ghost: false}; });
    (opts.ghosts || []).forEach(function (r) { rows.push({row: r, ghost: true}); });
    var labels = rows.map(function (x) { return x.row.label; });
    var terms = [];
    rows.forEach(function (x) {
      Object.keys(x.row.terms).forEach(function (k) { if (terms.indexOf(k) < 0) terms.push(k); });
    });
    var series = terms.map(function (term) {
      return {
        name: term, type: "bar", stack: "total", barMaxWidth: 26, emphasis: {focus: "series"},
        itemStyle: {color: colour(term)},
        data: rows.map(function (x) {
          var v = x.row.terms[term] || 0;
          var item = {value: v, plan: x.row.plan};
          if (x.ghost) item.itemStyle = {opacity: 0.45, decal: {symbol: "rect", dashArrayX: [1, 0],
            dashArrayY: [3, 3], rotation: -0.8, color: "rgba(255,255,255,0.6)"}};
          return item;
        })
      };
    });
    if (isMemory && data.capacity_gib) {
      series.push({name: "HBM capacity", type: "line", data: [], itemStyle: {color: "#222"},
        markLine: {silent: true, symbol: "none", lineStyle: {color: "#222", type: "dashed", width: 1.5},
          label: {formatter: "HBM " + formatGiB(data.capacity_gib), position: "start", color: "#222", fontSize: 11},
          data: [{xAxis: data.capacity_gib}]}});
    }
    var option = base(data.title);
    option.tooltip.trigger = "axis";
    option.tooltip.axisPointer = {type: "shadow"};
    option.tooltip.formatter = function (items) {
      if (!items.length) return "";
      var total = 0;
      var lines = items.filter(function (it) { return it.value > 0; }).map(function (it) {
        total += it.value;
        return it.marker + escapeHtml(it.seriesName) + ": <b>" + fmt(it.value) + "</b>";
      });
      var head = "<b>" + escapeHtml(items[0].name) + "</b><br>" + (isMemory ? "peak " : "step ") + fmt(total);
      return head + "<br>" + lines.join("<br>");
    };
    option.legend = {bottom: 0, left: 0, right: 0, itemWidth: 12, itemHeight: 9, itemGap: 8, textStyle: {fontSize: 11},
      data: terms};
    var legendRows = Math.ceil(terms.join("").length / 70);
    option.grid = {left: 8, right: 48, top: isMemory ? 44 : 34, bottom: 36 + 18 * legendRows, containLabel: true};
    option.xAxis = {type: "value", name: isMemory ? "GiB per GPU" : "seconds per step", nameLocation: "middle",
      nameGap: 24, axisLabel: {formatter: function (v) { return isMemory ? v : axisSeconds(v); }},
      max: isMemory && data.capacity_gib ? function (v) { return Math.max(v.max, data.capacity_gib) * 1.05; } : null,
      splitLine: {lineStyle: {color: "#eef"}}};
    option.yAxis = {type: "category", data: labels, inverse: true, axisTick: {show: false},
      axisLabel: {width: 230, overflow: "truncate", rich: {sel: {fontWeight: "bold", color: "#c05a00"}},
        formatter: function (v, i) {
          var r = rows[i];
          return r && !r.ghost && opts.selected && r.row.plan === opts.selected ? "{sel|▶ " + v + "}" : v;
        }}};
    option.dataZoom = [{type: "inside", xAxisIndex: 0, filterMode: "none"}];
    option.series = series;
    return draw(el, option, opts);
  }

  function paretoChart(el, data, opts) {
    function pts(list) { return (list || []).map(function (p) { return {value: [p[0], p[1]], label: p[2], plan: p[3]}; }); }
    var series = [
      {name: "feasible plans", type: "scatter", symbolSize: 5, itemStyle: {color: "#9aa7bd", opacity: 0.55},
        data: pts(data.points), large: data.points.length > 3000},
      {name: "Pareto front", type: "line", step: false, symbol: "circle", symbolSize: 8,
        lineStyle: {color: "#4e79a7", width: 2}, itemStyle: {color: "#4e79a7"}, data: pts(data.front)}
    ];
    if (opts.previousFront && opts.previousFront.length) {
      series.push({name: "previous front", type: "line", symbol: "emptyCircle", symbolSize: 6,
        lineStyle: {color: "#999", type: "dashed"}, itemStyle: {color: "#999"}, data: pts(opts.previousFront)});
    }
    if (data.recommended) {
      series.push({name: "recommended", type: "scatter", symbol: "diamond", symbolSize: 16, z: 5,
        itemStyle: {color: "#e15759", borderColor: "#fff", borderWidth: 1}, data: pts([data.recommended])});
    }
    if (opts.selected && (!data.recommended || opts.selected !== data.recommended[3])) {
      var sel = data.points.filter(function (p) { return p[3] === opts.selected; });
      if (sel.length) series.push({name: "selected", type: "scatter", symbol: "circle", symbolSize: 13, z: 6,
        itemStyle: {color: "#f28e2b", borderColor: "#fff", borderWidth: 1}, data: pts(sel)});
    }
    var option = base(data.title);
    option.tooltip.trigger = "item";
    option.tooltip.formatter = function (it) {
      var d = it.data;
      return "<b>" + escapeHtml(d.label) + "</b><br><span style='color:#667'>" + escapeHtml(d.plan) + "</span><br>" +
        "step " + formatSeconds(d.value[0]) + ", headroom " + formatGiB(d.value[1]);
    };
    option.legend = {bottom: 0, textStyle: {fontSize: 11}};
    option.grid = {left: 8, right: 24, top: 34, bottom: 60, containLabel: true};
    option.xAxis = {type: "value", name: "step time", nameLocation: "middle", nameGap: 26, scale: true,
      axisLabel: {formatter: axisSeconds, hideOverlap: true}, splitLine: {lineStyle: {color: "#eef"}}};
    option.yAxis = {type: "value", name: "memory headroom (GiB)", nameLocation: "middle", nameGap: 40, scale: true,
      splitLine: {lineStyle: {color: "#eef"}}};
    // open on the plans near the front (a slow plan can take ten times the best step); scroll out for the rest
    var best = data.front.length ? data.front[0][0] : null;
    var slowest = data.points.reduce(function (m, p) { return Math.max(m, p[0]); }, 0);
    var xZoom = {type: "inside", xAxisIndex: 0, filterMode: "none"};
    if (best && slowest > 3 * best) { xZoom.startValue = 0.9 * best; xZoom.endValue = 2.5 * best; }
    option.dataZoom = [xZoom, {type: "inside", yAxisIndex: 0, filterMode: "none"}];
    option.series = series;
    return draw(el, option, opts);
  }

  function sweepChart(el, data, opts) {
    var series = data.families.map(function (f) {
      return {name: f.name, type: "line", symbol: "circle", symbolSize: 5, emphasis: {focus: "series"},
        data: f.points.map(function (p) { return {value: [p[0], p[1]], label: p[2]}; })};
    });
    series.push({name: "recommended", type: "line", symbol: "none", lineStyle: {color: "#111", type: "dashed", width: 1.5},
      itemStyle: {color: "#111"}, data: data.recommended.map(function (p) { return {value: [p[0], p[1]], label: p[2]}; }),
      markLine: {silent: true, symbol: "none", lineStyle: {color: "#999", type: "dotted"},
        label: {formatter: "{b}", position: "insideEndTop", fontSize: 10, color: "#555"},
        data: data.changes.map(function (c) { return {xAxis: c.x, name: c.label}; })}});
    var option = base(data.title);
    option.title.textStyle.fontSize = 12;
    option.tooltip.trigger = "item";
    option.tooltip.formatter = function (it) {
      return escapeHtml(it.seriesName) + "<br><b>" + escapeHtml(it.data.label) + "</b><br>" +
        escapeHtml(data.x_title) + ": " + Number(it.data.value[0]).toLocaleString("en-US", {maximumSignificantDigits: 4}) +
        "<br>" + Math.round(it.data.value[1]).toLocaleString("en-US") + " tokens/s per GPU";
    };
    option.legend = {type: "scroll", bottom: 0, textStyle: {fontSize: 11}};
    option.grid = {left: 8, right: 24, top: 40, bottom: 64, containLabel: true};
    option.xAxis = {type: data.log_x ? "log" : "value", name: data.x_title, nameLocation: "middle", nameGap: 26,
      scale: true, splitLine: {lineStyle: {color: "#eef"}}};
    option.yAxis = {type: "value", name: data.y_title, nameLocation: "middle", nameGap: 44, scale: true,
      axisLabel: {formatter: function (v) { return v >= 1e4 ? +(v / 1e3).toPrecision(3) + "k" : v; }},
      splitLine: {lineStyle: {color: "#eef"}}};
    option.dataZoom = [{type: "inside", xAxisIndex: 0, filterMode: "none"}];
    option.series = series;
    return draw(el, option, opts);
  }

  function timelineChart(el, data, opts) {
    var cats = [];
    data.ops.forEach(function (o) { if (cats.indexOf(o[3]) < 0) cats.push(o[3]); });
    var series = cats.map(function (cat) {
      return {
        name: cat, type: "custom", renderItem: renderBar, encode: {x: [1, 2], y: 0},
        itemStyle: {color: colour(cat)},
        data: data.ops.filter(function (o) { return o[3] === cat; }).map(function (o) {
          return {value: [o[0], o[1], o[1] + o[2], o[2]], name: o[4]};
        })
      };
    });
    var option = base(data.title);
    option.animation = false;
    option.tooltip.trigger = "item";
    option.tooltip.formatter = function (it) {
      return "<b>" + escapeHtml(it.name) + "</b><br>" + escapeHtml(it.seriesName) + "<br>" +
        escapeHtml(data.lanes[it.value[0]]) + "<br>from " + it.value[1].toFixed(2) + " ms for " +
        it.value[3].toFixed(2) + " ms";
    };
    option.legend = {bottom: 0, itemWidth: 12, itemHeight: 9, textStyle: {fontSize: 11}};
    var sliderBottom = 14 + 18 * Math.max(1, Math.ceil(cats.join("").length / 90));
    option.grid = {left: 8, right: 24, top: 34, bottom: sliderBottom + 58, containLabel: true};
    option.xAxis = {type: "value", name: "ms from the step's start", nameLocation: "middle", nameGap: 24, min: 0, max: "dataMax",
      axisLabel: {hideOverlap: true, formatter: function (v) {
        return v.toLocaleString("en-US", {maximumSignificantDigits: 4});
      }}, splitLine: {lineStyle: {color: "#eef"}}};
    option.yAxis = {type: "category", data: data.lanes, inverse: true, axisTick: {show: false},
      axisLabel: {fontSize: 11, width: 200, overflow: "truncate"}};
    option.dataZoom = [{type: "slider", xAxisIndex: 0, filterMode: "weakFilter", height: 18, bottom: sliderBottom},
      {type: "inside", xAxisIndex: 0, filterMode: "weakFilter"}];
    option.series = series;
    return draw(el, option, opts);
  }

  function renderBar(params, api) {
    var lane = api.value(0);
    var start = api.coord([api.value(1), lane]);
    var end = api.coord([api.value(2), lane]);
    var height = api.size([0, 1])[1] * 0.62;
    var cs = params.coordSys;
    var shape = root.echarts.graphic.clipRectByRect(
      {x: start[0], y: start[1] - height / 2, width: Math.max(end[0] - start[0], 0.6), height: height},
      {x: cs.x, y: cs.y, width: cs.width, height: cs.height});
    return shape && {type: "rect", transition: ["shape"], shape: shape, style: api.style()};
  }

  function draw(el, option, opts) {
    var chart = root.echarts.getInstanceByDom(el);
    if (chart) chart.resize();  // the container may have changed size (a timeline's height follows its lanes)
    else chart = root.echarts.init(el, null, {renderer: "canvas"});
    chart.setOption(option, true);
    chart.off("click");
    if (opts.onSelect) {
      chart.on("click", function (p) {
        var plan = p.data && p.data.plan;
        if (plan) opts.onSelect(plan);
      });
    }
    return chart;
  }

  function render(el, data, opts) {
    opts = opts || {};
    if (!data) return null;
    if (data.kind === "memory" || data.kind === "time") return stacked(el, data, opts);
    if (data.kind === "pareto") return paretoChart(el, data, opts);
    if (data.kind === "sweep") return sweepChart(el, data, opts);
    if (data.kind === "timeline") return timelineChart(el, data, opts);
    throw new Error("unknown chart kind " + data.kind);
  }

  root.meshplanCharts = {render: render, formatSeconds: formatSeconds, axisSeconds: axisSeconds, formatGiB: formatGiB, escapeHtml: escapeHtml,
    colour: colour};
  if (root.addEventListener) {
    root.addEventListener("resize", function () {
      var els = document.querySelectorAll("[_echarts_instance_]");
      for (var i = 0; i < els.length; i++) {
        var c = root.echarts.getInstanceByDom(els[i]);
        if (c) c.resize();
      }
    });
  }
})(window);
