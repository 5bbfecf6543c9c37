// The usage page: the chart is drawn by the server; the remaining quota and reset times
// come from /api/v1/quota, the period's totals from /api/v1/usage.
"use strict";
(() => {
  const {api, el, when} = window.ragtier;
  const box = document.getElementById("usage");
  if (!box) return;
  const number = value => value === null || value === undefined ? "unknown" : Number(value).toLocaleString();
  const PERIODS = {day: "Daily quota", month: "Monthly quota"};
  const BUDGETS = {day_usd: "Daily budget", month_usd: "Monthly budget"};
  // "team", "key <prefix>", "team tag <tag>" (quota_report's scopes).
  const scopeTitle = scope => scope === "team" ? "Team"
    : scope.startsWith("key ") ? `Key ${scope.slice(4)}` : `Tag ${scope.slice(9)}`;

  function quotaEntry(entry) {
    const list = el("dl", {class: "quota"});
    const add = (term, value) => list.append(el("dt", {text: term}), el("dd", {text: value}));
    for (const [period, label] of Object.entries(PERIODS)) {
      const quota = entry[period];
      if (!quota) continue;
      add(label, `${number(quota.remaining)} of ${number(quota.limit)} tokens remaining`);
      add(`${label} resets`, when(quota.resets_at));
    }
    for (const [period, label] of Object.entries(BUDGETS)) {
      const budget = entry[period];
      if (!budget) continue;
      add(label, `$${budget.remaining} of $${budget.limit} remaining`);
      add(`${label} resets`, when(budget.resets_at));
    }
    if (entry.bucket) {
      add("Tokens per minute", `${number(entry.bucket.available)} of ${number(entry.bucket.capacity)} available now ` +
        `(refills ${number(entry.bucket.tokens_per_minute)}/min)`);
    }
    if (entry.max_concurrent_streams) add("Concurrent answers", `at most ${entry.max_concurrent_streams}`);
    if (entry.max_tokens) add("Output tokens per answer", `at most ${number(entry.max_tokens)}`);
    return el("div", {class: "quota-entry"}, el("h3", {text: scopeTitle(entry.scope)}), list);
  }

  async function showQuota() {
    const target = document.getElementById("quota");
    try {
      const quota = await api("GET", "/api/v1/quota");
      target.replaceChildren(...(quota.unlimited
        ? [el("p", {text: "Unlimited: no token limits are set for your team."})]
        : quota.limits.map(quotaEntry)));
    } catch (err) {
      target.replaceChildren(el("p", {class: "error", text: err.message}));
    }
  }

  async function showTotals(target, groupBy) {
    const query = new URLSearchParams({start: box.dataset.start, end: box.dataset.end, group_by: groupBy});
    try {
      const usage = await api("GET", `/api/v1/usage?${query}`);
      const list = el("dl", {class: "quota"});
      for (const row of usage.data) {
        const cost = groupBy === "tag" ? ` · $${row.cost_usd}` : "";
        list.append(el("dt", {text: row.group || "(untagged)"}), el("dd", {text: `${number(row.total_tokens)} tokens${cost}`}));
      }
      list.append(el("dt", {text: "Total"}), el("dd", {text: `${number(usage.total.total_tokens)} tokens in ${number(usage.total.requests)} requests`}));
      list.append(el("dt", {text: "Cost"}), el("dd", {text: `$${usage.total.cost_usd}`}));
      target.replaceChildren(list);
    } catch (err) {
      target.replaceChildren(el("p", {class: "error", text: err.message}));
    }
  }

  showQuota();
  showTotals(document.getElementById("totals"), "kind");
  showTotals(document.getElementById("totals-by-tag"), "tag");
})();
