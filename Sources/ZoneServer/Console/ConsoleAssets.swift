/// The console's stylesheet and its one script (the live charts), served from
/// `/console/static/` — the only places its Content-Security-Policy lets a style or a script
/// come from. No build step, nothing fetched: plain CSS, and a script that draws SVG lines.
enum ConsoleAssets {
    static let css = """
        :root { color-scheme: light dark; font-family: system-ui, sans-serif; }
        body { margin: 0; }
        header { background: #234; padding: .5rem 1rem; }
        header a, header button { color: #fff; margin-right: 1rem; font: inherit; }
        header button { background: none; border: 1px solid #fff; border-radius: 3px; cursor: pointer; }
        a:focus, button:focus, input:focus { outline: 3px solid #fa0; outline-offset: 2px; }
        main { padding: 1rem; max-width: 80rem; }
        form.inline { display: inline; }
        table { border-collapse: collapse; margin: .5rem 0; }
        caption { text-align: left; font-weight: bold; padding: .25rem 0; }
        th, td { border: 1px solid #8888; padding: .25rem .5rem; text-align: left; vertical-align: top; overflow-wrap: anywhere; }
        code { font-family: ui-monospace, monospace; }
        .good { color: #080; }
        .bad { color: #c00; font-weight: bold; }
        .error { color: #c00; }
        .cipher { font-family: ui-monospace, monospace; color: #777; }
        label { display: block; margin: .5rem 0; }
        figure { margin: 1rem 0; }
        svg { width: 100%; max-width: 600px; height: 120px; border: 1px solid #8888; }
        svg polyline { fill: none; stroke: #36c; stroke-width: 2; }
        svg text { font-size: 10px; fill: currentColor; }
        """

    static let script = """
        "use strict";
        (function () {
          const root = document.getElementById("charts");
          if (!root) return;
          const source = root.dataset.source;
          const series = { requests: [], latency: [], saves: [], polls: [] };
          let previous = null;
          function draw(id, values) {
            const svg = document.getElementById(id);
            while (svg.firstChild) svg.removeChild(svg.firstChild);
            const top = Math.max(1, ...values);
            const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
            line.setAttribute("points", values.map((v, i) => (i * 10) + "," + (115 - v / top * 105)).join(" "));
            svg.appendChild(line);
            const label = document.createElementNS("http://www.w3.org/2000/svg", "text");
            label.setAttribute("x", "4");
            label.setAttribute("y", "12");
            label.textContent = "max " + top.toFixed(1) + ", now " + (values.length ? values[values.length - 1].toFixed(1) : "-");
            svg.appendChild(label);
            svg.dataset.points = String(values.length);
            svg.dataset.last = values.length ? String(values[values.length - 1]) : "";
          }
          function push(name, value) {
            series[name].push(value);
            if (series[name].length > 60) series[name].shift();
          }
          async function tick() {
            try {
              const response = await fetch(source, { credentials: "same-origin", cache: "no-store" });
              if (response.ok) {
                const now = await response.json();
                if (previous) {
                  const seconds = Math.max(0.001, now.time - previous.time);
                  const requests = now.requests - previous.requests;
                  push("requests", requests / seconds);
                  push("latency", requests > 0 ? (now.latencySeconds - previous.latencySeconds) / requests * 1000 : 0);
                  push("saves", (now.saves - previous.saves) / seconds);
                  push("polls", now.longPolls);
                  draw("chart-requests", series.requests);
                  draw("chart-latency", series.latency);
                  draw("chart-saves", series.saves);
                  draw("chart-polls", series.polls);
                }
                previous = now;
              }
            } catch (error) { /* the next tick tries again */ }
            setTimeout(tick, 2000);
          }
          tick();
        })();
        """
}
