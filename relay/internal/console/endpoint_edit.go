package console

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/internal/endpoints"
)

// ChangesLimitDefault caps an endpoint's change history on its page.
const ChangesLimitDefault = 50

// scratchConfig is cfg with tes as its only table endpoints, and without
// the file's endpoints of their names: each row resolved as the relay
// will resolve it, whatever the file defines (a conflict is shown apart).
func scratchConfig(cfg *config.Config, tes []config.TableEndpoint) *config.Config {
	cp := *cfg
	cp.Endpoints = make(map[string]config.Endpoint, len(cfg.Endpoints))
	for k, v := range cfg.Endpoints {
		cp.Endpoints[k] = v
	}
	cp.EndpointTable = config.NewEndpointTable()
	for _, te := range tes {
		delete(cp.Endpoints, te.Name)
		cp.EndpointTable.Apply(te)
	}
	return &cp
}

// resolveScratch resolves one row (see scratchConfig).
func resolveScratch(cfg *config.Config, te config.TableEndpoint) config.Endpoint {
	return scratchConfig(cfg, []config.TableEndpoint{te}).Endpoint(te.Name)
}

// kv is one setting shown read-only.
type kv struct{ Key, Value string }

// rowSettings are a table row's settings as shown read-only: the columns
// set, URLs cut as every page cuts them, header values as ***, a body
// only with log_payloads.
func (c *Console) rowSettings(rq *request, row endpoints.Row) []kv {
	out := []kv{{"enabled", map[bool]string{true: "yes", false: "no"}[val(row, "enabled") != "f"]}}
	form := formFromRow(row)
	for _, fv := range form.Fields {
		v := fv.Value
		switch {
		case v == "":
			continue
		case fv.Col == "url":
			v = c.target(rq, v)
		case fv.Col == "body" && !rq.cfg.LogPayloads:
			v = "(a template, shown with log_payloads)"
		case fv.Kind == kindHeaders:
			v = strings.ReplaceAll(strings.TrimSpace(v), "\n", ", ")
		}
		out = append(out, kv{fv.Col, v})
	}
	return out
}

// fileSettings are a file endpoint's main settings, read-only.
func (c *Console) fileSettings(rq *request, ep config.Endpoint) []kv {
	out := []kv{{"url", c.target(rq, ep.URL)}, {"method", ep.Method}, {"timeout", ep.Timeout.String()},
		{"max_attempts", itoa(ep.MaxAttempts)}}
	if len(ep.Headers) > 0 {
		out = append(out, kv{"headers", maskedHeaderNames(ep.Headers)})
	}
	return out
}

func maskedHeaderNames(h map[string]string) string {
	b, _ := json.Marshal(h)
	return strings.ReplaceAll(strings.TrimSpace(maskedHeaders(string(b))), "\n", ", ")
}

// formPage is the page of the endpoint form on its own: a new endpoint,
// or an edit the database refused.
type formPage struct {
	Form *endpointForm
}

// actor is how the change log names the request's session: console:
// and a short id derived from the session's id (console:bearer for the
// bearer header, which names no session).
func (rq *request) actor() string {
	if rq.s.bearer {
		return "console:bearer"
	}
	return "console:" + shortSession(rq.s.id)
}

// newEndpoint shows the empty form.
func (c *Console) newEndpoint(rq *request) error {
	f := &endpointForm{New: true, Enabled: true, Actor: rq.actor()}
	for _, ff := range formFields {
		f.Fields = append(f.Fields, fieldView{formField: ff}.withKind())
	}
	c.render(rq, http.StatusOK, "endpointform", "New endpoint", "endpoints", 0, formPage{Form: f})
	return nil
}

// createEndpoint inserts a row; with errors, the form again.
func (c *Console) createEndpoint(rq *request) (string, error) {
	f := formFromRequest(rq.r, true)
	return c.saveEndpoint(rq, f, nil)
}

// editEndpoint updates a row, over the revision its form was read at.
func (c *Console) editEndpoint(rq *request) (string, error) {
	f := formFromRequest(rq.r, false)
	f.Name = rq.r.PathValue("name")
	if _, err := strconv.ParseInt(f.Revision, 10, 64); err != nil {
		return "", badRequest("The form names no revision of the row: reload the page.")
	}
	stored, err := readEndpointRow(rq.ctx, rq.pool, f.Name)
	if err != nil {
		return "", err
	}
	if stored == nil {
		return "", &httpError{http.StatusNotFound, "Not found", "No row of postbox.endpoints has this name (it may have been deleted)."}
	}
	f.Enabled = val(stored, "enabled") != "f"
	return c.saveEndpoint(rq, f, stored)
}

func (c *Console) saveEndpoint(rq *request, f *endpointForm, stored endpoints.Row) (string, error) {
	f.Actor = rq.actor()
	s, err := validate(rq.ctx, rq.pool, rq.cfg, f, stored)
	if err != nil {
		return "", err
	}
	if s != nil {
		err = writeEndpoint(rq.ctx, rq.pool, f, s, f.Actor)
		if errors.Is(err, errStale) {
			f.Error = "This endpoint changed since you opened the form (see its changes): reload the page, then make your change again."
			err = nil
		} else if err != nil {
			return "", err
		}
	}
	title := "New endpoint"
	if !f.New {
		title = "Edit " + f.Name
	}
	if f.hasErrors() {
		c.render(rq, http.StatusUnprocessableEntity, "endpointform", title, "endpoints", 0, formPage{Form: f})
		return "", nil
	}
	done := "saved"
	if f.New {
		done = "created"
	}
	c.log.Info().Str("endpoint", f.Name).Str("by", f.Actor).Bool("new", f.New).Msg("console endpoint saved")
	return withFlash("/endpoints/"+pathEscape(f.Name), done, -1), nil
}

// setEnabled disables or enables a table endpoint.
func (c *Console) setEnabled(enabled bool) func(rq *request) (string, error) {
	return func(rq *request) (string, error) {
		name := rq.r.PathValue("name")
		if err := c.changeRow(rq, name, endpointEnableSQL, name, enabled); err != nil {
			return "", err
		}
		done := "disabled"
		if enabled {
			done = "enabled"
		}
		c.log.Info().Str("endpoint", name).Str("by", rq.actor()).Msg("console endpoint " + done)
		return withFlash("/endpoints/"+pathEscape(name), done, -1), nil
	}
}

type deletePage struct {
	Name string
}

// confirmDelete asks before a delete.
func (c *Console) confirmDelete(rq *request) error {
	name := rq.r.PathValue("name")
	row, err := readEndpointRow(rq.ctx, rq.pool, name)
	if err != nil {
		return err
	}
	if row == nil {
		return errNotFound
	}
	c.render(rq, http.StatusOK, "endpointdelete", "Delete "+name, "endpoints", 0, deletePage{Name: name})
	return nil
}

func (c *Console) deleteEndpoint(rq *request) (string, error) {
	name := rq.r.PathValue("name")
	if err := c.changeRow(rq, name, endpointDeleteSQL, name); err != nil {
		return "", err
	}
	c.log.Info().Str("endpoint", name).Str("by", rq.actor()).Msg("console endpoint deleted")
	return withFlash("/endpoints", "deleted", -1), nil
}

// changeRow runs one statement on name's row in a transaction that names
// the session in the change log.
func (c *Console) changeRow(rq *request, name, sql string, args ...any) error {
	tx, err := rq.pool.Begin(rq.ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(rq.ctx) }()
	if _, err := tx.Exec(rq.ctx, endpointActorSQL, rq.actor()); err != nil {
		return err
	}
	var exists bool
	if err := tx.QueryRow(rq.ctx, endpointExistsSQL, name).Scan(&exists); err != nil {
		return err
	}
	if !exists {
		return &httpError{http.StatusNotFound, "Not found", "No row of postbox.endpoints has this name (it may have been deleted)."}
	}
	if _, err := tx.Exec(rq.ctx, sql, args...); err != nil {
		return err
	}
	return tx.Commit(rq.ctx)
}
