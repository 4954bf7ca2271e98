// The live page of a running H2 job (docs/admin.md, "Live page"): asks the
// job for /api/state every two seconds and draws it. Served by the job
// itself; builds the page with DOM calls and textContent only, so nothing
// the job reports is ever parsed as HTML.
'use strict';
(() => {
  const refreshMs = 2000;
  const svgNs = 'http://www.w3.org/2000/svg';
  const $ = (id) => document.getElementById(id);
  let token = sessionStorage.getItem('h2-admin-token') || '';
  let timelineStep = 0;
  let timelineUrl = null;

  function headers() {
    return token ? {Authorization : 'Bearer ' + token} : {};
  }

  // The response, or null when the job wants the admin token.
  async function get(path) {
    const r = await fetch(path, {headers : headers(), cache : 'no-store'});
    if (r.status === 401) {
      showLogin(token ? 'the job refused that token' : '');
      return null;
    }
    if (!r.ok)
      throw new Error(path + ': HTTP ' + r.status);
    return r;
  }

  function showLogin(message) {
    token = '';
    sessionStorage.removeItem('h2-admin-token');
    $('content').hidden = true;
    $('login').hidden = false;
    $('login-error').textContent = message;
    $('summary').textContent = 'waiting for the admin token';
  }

  function element(tag, text, className) {
    const e = document.createElement(tag);
    if (text !== undefined)
      e.textContent = String(text);
    if (className)
      e.className = className;
    return e;
  }

  function number(x, digits) {
    return Number.isFinite(x) ? x.toFixed(digits) : '–';
  }

  function bytes(n) {
    const units = [ 'B', 'KiB', 'MiB', 'GiB', 'TiB' ];
    let u = 0;
    while (n >= 1024 && u < units.length - 1) {
      n /= 1024;
      ++u;
    }
    return n.toFixed(1) + ' ' + units[u];
  }

  // A cell with a bar filled to `fraction` (0..1) and its text.
  function barCell(fraction, text, kind) {
    const td = element('td');
    const bar = element('span', undefined, 'bar');
    const fill = element('div', undefined, 'fill' + (kind ? ' ' + kind : ''));
    fill.style.width =
      (100 * Math.min(1, Math.max(0, fraction))).toFixed(1) + '%';
    bar.appendChild(fill);
    td.appendChild(bar);
    td.appendChild(document.createTextNode(text));
    return td;
  }

  function svgElement(tag, attributes, text) {
    const e = document.createElementNS(svgNs, tag);
    for (const [k, v] of Object.entries(attributes))
      e.setAttribute(k, String(v));
    if (text !== undefined)
      e.textContent = String(text);
    return e;
  }

  // A line chart of ys over xs in `svg` (viewBox 480 x 180), with the
  // range of each axis written at its ends.
  function drawChart(svg, xs, ys, digits) {
    svg.replaceChildren();
    if (xs.length === 0) {
      svg.appendChild(svgElement('text', {x : 12, y : 90}, 'no steps yet'));
      return;
    }
    const left = 56, right = 470, top = 10, bottom = 160;
    let lo = Math.min(...ys), hi = Math.max(...ys);
    if (hi === lo) {
      hi += 0.5;
      lo -= 0.5;
    }
    const x0 = xs[0], x1 = xs.length > 1 ? xs[xs.length - 1] : xs[0] + 1;
    const px = (x) => left + (right - left) * (x - x0) / (x1 - x0);
    const py = (y) => bottom - (bottom - top) * (y - lo) / (hi - lo);
    const points =
      xs.map((x, i) => px(x).toFixed(1) + ',' + py(ys[i]).toFixed(1));
    svg.appendChild(svgElement(
      'line',
      {x1 : left, y1 : bottom, x2 : right, y2 : bottom, stroke : '#bbb'}));
    svg.appendChild(svgElement(
      'line', {x1 : left, y1 : top, x2 : left, y2 : bottom, stroke : '#bbb'}));
    svg.appendChild(svgElement('polyline', {points : points.join(' ')}));
    svg.appendChild(
      svgElement('text', {x : 4, y : top + 8}, number(hi, digits)));
    svg.appendChild(
      svgElement('text', {x : 4, y : bottom}, number(lo, digits)));
    svg.appendChild(svgElement('text', {x : left, y : 175}, 'step ' + x0));
    svg.appendChild(svgElement('text',
                               {x : right, y : 175, 'text-anchor' : 'end'},
                               'step ' + xs[xs.length - 1]));
  }

  function renderChips(s) {
    const body = $('chips').tBodies[0];
    body.replaceChildren();
    for (const c of s.chips) {
      const tr = element('tr');
      tr.appendChild(element('td', c.label));
      tr.appendChild(element('td', c.replica ?? '–'));
      tr.appendChild(element('td', c.stage ?? '–'));
      if (c.utilisation === undefined) {
        tr.appendChild(element('td', '–'));
        tr.appendChild(element('td', '–'));
      } else {
        tr.appendChild(
          barCell(c.utilisation, number(100 * c.utilisation, 1) + '%'));
        tr.appendChild(
          barCell(c.bubble, number(100 * c.bubble, 1) + '%', 'idle'));
      }
      const m = c.memory;
      const of = m.capacity_bytes > 0 ? m.peak_bytes / m.capacity_bytes : 0;
      tr.appendChild(barCell(
        of, bytes(m.peak_bytes) + ' of ' + bytes(m.capacity_bytes), 'memory'));
      body.appendChild(tr);
    }
    $('chips-note').textContent =
      s.last ? '(step ' + s.last.step + ')' : '(before the first step)';
  }

  function renderPlan(s) {
    const body = $('plan').tBodies[0];
    body.replaceChildren();
    s.plan.forEach((r, ri) => {
      r.stages.forEach((st, si) => {
        const tr = element('tr');
        tr.appendChild(element('td', si === 0
                                       ? ri + ' (' + r.micro_batches + ' × ' +
                                           r.micro_batch_size + ')'
                                       : ''));
        tr.appendChild(element(
          'td',
          si + (st.position !== si ? ' (position ' + st.position + ')' : '')));
        tr.appendChild(element('td', st.chip));
        tr.appendChild(element('td', st.profile + ' (' + st.vendor + ')'));
        tr.appendChild(
          element('td', '[' + st.first_layer + ', ' + st.end_layer + ')'));
        tr.appendChild(element('td', st.recompute));
        body.appendChild(tr);
      });
    });
    $('plan-note').textContent =
      s.schedule ? '(' + s.schedule + ', plan ' + s.generation + ')' : '';
  }

  function renderEvents(s) {
    const list = $('events');
    list.replaceChildren();
    for (const e of [...s.events].reverse()) {
      const li = element('li');
      li.appendChild(element('span', e.kind, 'kind'));
      li.appendChild(
        document.createTextNode('after step ' + e.step + ': ' + e.text));
      list.appendChild(li);
    }
  }

  function render(s) {
    $('login').hidden = true;
    $('content').hidden = false;
    $('job').textContent = 'H2: ' + s.job;
    document.title = 'H2: ' + s.job;
    let summary = s.status + ' | step ' + s.steps_done + ' of ' +
                  s.total_steps + ' | ' + s.model + ' | ' + s.clock + ' clock';
    if (s.last) {
      summary += ' | loss ' + number(s.last.loss, 4) + ' | ' +
                 number(s.last.tokens_per_second, 0) + ' tokens/s | bubble ' +
                 number(100 * s.last.bubble_fraction, 1) + '%';
    }
    $('summary').textContent = summary;
    drawChart($('loss-chart'), s.history.step, s.history.loss, 3);
    drawChart($('rate-chart'), s.history.step, s.history.tokens_per_second, 0);
    renderChips(s);
    renderPlan(s);
    renderEvents(s);
  }

  async function loadTimeline(step) {
    const r = await get('/api/timeline.svg');
    if (!r)
      return;
    const blob = await r.blob();
    // The job may have finished another step since /api/state: the
    // drawing's title names the one it shows.
    const drawn = /step (\d+) as measured/.exec(await blob.text());
    const url = URL.createObjectURL(blob);
    $('timeline').src = url;
    if (timelineUrl)
      URL.revokeObjectURL(timelineUrl);
    timelineUrl = url;
    timelineStep = step;
    $('timeline-note').textContent =
      'step ' + (drawn ? drawn[1] : step) + ', as the chips measured it';
  }

  // One chain of refreshes at a time: a new one (the token form) replaces
  // the pending one. It ends with the job: when the job says it is done or
  // stopped, or after `maxFailures` refreshes in a row that could not reach
  // it (a job's server closes when it exits).
  const maxFailures = 3;
  let timer = null;
  let busy = false;
  let failures = 0;

  function schedule() {
    clearTimeout(timer);
    timer = setTimeout(refresh, refreshMs);
  }

  async function refresh() {
    clearTimeout(timer);
    if (busy)
      return;
    busy = true;
    let again = true;
    try {
      const r = await get('/api/state');
      if (!r) {
        busy = false;
        return; // the login form starts the next chain
      }
      const s = await r.json();
      failures = 0;
      render(s);
      if (s.timeline_step > 0 && s.timeline_step !== timelineStep)
        await loadTimeline(s.timeline_step);
      if (s.timeline_step === 0) {
        $('timeline-note').textContent =
          'no timeline: this process has not recorded a step yet';
      }
      $('updated').textContent = new Date().toLocaleTimeString();
      again = s.status === 'starting' || s.status === 'training';
    } catch (e) {
      again = ++failures < maxFailures;
      $('summary').textContent =
        again ? 'cannot reach the job (' + e.message + '); trying again'
              : 'the job has ended, or cannot be reached (' + e.message + ')';
    }
    busy = false;
    if (again)
      schedule();
  }

  $('login-form').addEventListener('submit', (event) => {
    event.preventDefault();
    token = $('token').value.trim();
    $('token').value = '';
    sessionStorage.setItem('h2-admin-token', token);
    refresh();
  });

  if (document.documentElement.dataset.page === 'token' && !token)
    showLogin('');
  else
    refresh();
})();
