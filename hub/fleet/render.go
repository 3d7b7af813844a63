package fleet

import (
	"errors"
	"fmt"
	"html/template"
	"io"
	"time"
)

// errNotSynced is what the page answers while its informers have not
// read the fleet yet.
var errNotSynced = errors.New("the fleet is still being read; try again in a moment")

// The page and its body: the body alone is what the script fetches to
// refresh the figures.
const pageHTML = `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>tether fleet</title>
<link rel="stylesheet" href="fleet.css">
<script src="fleet.js" defer></script>
</head>
<body>
<main id="fleet">{{template "body" .}}</main>
</body>
</html>`

const bodyHTML = `{{define "body"}}<header>
<h1>Fleet</h1>
<p class="summary">{{count (len .Sites) "site"}}, {{count .Nodes "node"}}, {{count .Pods "pod"}}
· as of <time datetime="{{.At | iso}}">{{.At | clock}}</time></p>
</header>
{{if not .Sites}}<p class="empty">No node has joined the hub yet.</p>{{end}}
{{if .Rollouts}}<section class="rollouts">
<h2>Agent rollouts</h2>
<table>
<thead><tr><th>Rollout</th><th>Version</th><th>Phase</th><th>Upgraded</th><th>Upgrading</th><th>Failed</th><th>Last failure</th></tr></thead>
<tbody>
{{range .Rollouts}}<tr data-rollout="{{.Name}}" data-phase="{{.Phase}}">
<td>{{.Name}}</td><td>{{.Version}}</td><td><span class="phase {{.Phase}}">{{.Phase}}</span></td>
<td>{{.Upgraded}}/{{.Nodes}}</td><td>{{.Upgrading}}</td><td>{{.Failed}}</td><td>{{.LastFailure}}</td>
</tr>
{{end}}</tbody>
</table>
</section>
{{end}}
{{if .Stagings}}<section class="stagings">
<h2>Image staging</h2>
<table>
<thead><tr><th>Staging</th><th>Images</th><th>Phase</th><th>Nodes holding them</th></tr></thead>
<tbody>
{{range .Stagings}}<tr data-staging="{{.Name}}" data-phase="{{.Phase}}">
<td>{{.Name}}</td><td>{{.Images}}</td><td><span class="phase {{.Phase}}">{{.Phase}}</span></td><td>{{.Staged}}/{{.Nodes}}</td>
</tr>
{{end}}</tbody>
</table>
</section>
{{end}}{{range .Sites}}<section class="site" data-site="{{.Name}}" data-link="{{.Link}}">
<h2>{{.Name}} <span class="link {{.Link}}">{{.Link | linkText}}</span></h2>
<p class="counts">{{count (len .Nodes) "node"}}{{range $l, $n := .Counts}} · {{$n}} {{$l}}{{end}} · {{count .Pods "pod"}}
{{- if gt (len .Agents) 1}} · <span class="agents">agents{{range $v, $n := .Agents}} {{$v}} ×{{$n}}{{end}}</span>{{end}}</p>
<table>
<thead><tr><th>Node</th><th>Link</th><th>Last heard</th><th>Pods</th><th>Agent</th><th>Why</th></tr></thead>
<tbody>
{{range .Nodes}}<tr data-node="{{.Name}}" data-link="{{.Link}}">
<td>{{.Name}}{{if .Unschedulable}} <span class="cordoned">cordoned</span>{{end}}</td>
<td><span class="link {{.Link}}">{{.Link | linkText}}</span></td>
<td>{{ago $.At .LastHeard}}</td>
<td>{{.Pods}}</td>
<td>{{.Agent}}{{if .Upgrade}} <span class="upgrade">{{.Upgrade}}</span>{{end}}</td>
<td>{{.Message}}</td>
</tr>
{{end}}</tbody>
</table>
</section>
{{end}}{{end}}`

// script refreshes the body every two seconds with the server's own
// rendering; a failed fetch leaves the last figures up and says so.
const script = `"use strict";
(function () {
  var main = document.getElementById("fleet");
  function refresh() {
    fetch("?part=body", {cache: "no-store", credentials: "same-origin"})
      .then(function (r) {
        if (!r.ok) { throw new Error(r.status + " " + r.statusText); }
        return r.text();
      })
      .then(function (html) { main.innerHTML = html; main.removeAttribute("data-stale"); })
      .catch(function (e) { main.setAttribute("data-stale", String(e)); })
      .finally(function () { setTimeout(refresh, 2000); });
  }
  setTimeout(refresh, 2000);
})();
`

const style = `body { font-family: system-ui, sans-serif; margin: 1.5rem; color: #1b1f23; }
h1 { margin: 0 0 .25rem; font-size: 1.4rem; }
h2 { font-size: 1.1rem; margin: 1.2rem 0 .2rem; }
.summary, .counts { color: #57606a; margin: .2rem 0; }
table { border-collapse: collapse; width: 100%; max-width: 60rem; table-layout: fixed; }
th:nth-child(1) { width: 22%; } th:nth-child(2) { width: 22%; } th:nth-child(3) { width: 14%; } th:nth-child(4) { width: 8%; }
th, td { text-align: left; padding: .25rem .6rem; border-bottom: 1px solid #d0d7de; font-size: .9rem; }
.link { padding: .05rem .4rem; border-radius: .3rem; font-size: .8rem; }
.connected { background: #dafbe1; color: #116329; }
.not-ready, .unreachable { background: #fff8c5; color: #7d4e00; }
.partitioned { background: #ddf4ff; color: #0550ae; }
.dark { background: #57606a; color: #fff; }
.dead { background: #ffebe9; color: #a40e26; }
.cordoned, .upgrade { font-size: .75rem; color: #57606a; }
.phase { padding: .05rem .4rem; border-radius: .3rem; font-size: .8rem; }
.phase.Paused { background: #ffebe9; color: #a40e26; }
.phase.Progressing { background: #ddf4ff; color: #0550ae; }
.phase.Complete, .phase.Staged { background: #dafbe1; color: #116329; }
main[data-stale]::before { content: "not refreshed: " attr(data-stale); display: block; color: #a40e26; }
`

// linkText is how a link reads on the page.
func linkText(l Link) string {
	switch l {
	case Connected:
		return "connected"
	case NotReady:
		return "not ready"
	case Partitioned:
		return "partitioned: its site sees it"
	case Unreachable:
		return "unreachable"
	case Dark:
		return "dark: site cut off"
	case Dead:
		return "dead"
	}
	return string(l)
}

// count says "1 node", "2 nodes".
func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// ago says how long before at t was, or "never" for a zero t.
func ago(at, t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	d := at.Sub(t).Round(time.Second)
	switch {
	case d < time.Second:
		return "just now"
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds ago", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm ago", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd ago", int(d.Hours()/24))
}

// newTemplates parses the page's templates.
func newTemplates() *template.Template {
	funcs := template.FuncMap{
		"linkText": linkText,
		"count":    count,
		"ago":      ago,
		"iso":      func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
		"clock":    func(t time.Time) string { return t.UTC().Format("15:04:05 UTC") },
	}
	return template.Must(template.Must(template.New("page").Funcs(funcs).Parse(pageHTML)).Parse(bodyHTML))
}

func (p *Page) renderPage(w io.Writer, v View) error { return p.tmpl.ExecuteTemplate(w, "page", v) }
func (p *Page) renderBody(w io.Writer, v View) error { return p.tmpl.ExecuteTemplate(w, "body", v) }
