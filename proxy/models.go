package proxy

import (
	"encoding/json"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/oai"
)

// pathModels is the model list; pathModels+"/{id}" is one model, whose id
// may itself hold slashes ("meta-llama/Llama-3.1-8B-Instruct").
const pathModels = "/v1/models"

// isModelsPath reports whether a GET of path is answered by kvroute: the
// model list or one model of it.
func isModelsPath(path string) bool {
	return path == pathModels || len(path) > len(pathModels)+1 && strings.HasPrefix(path, pathModels+"/")
}

// modelCatalog is the part of backends.Fleet that knows each model's object
// as the replicas list it.
type modelCatalog interface {
	ModelList() []backends.Model
	Model(id string) (backends.Model, bool)
}

// serveModels answers GET /v1/models with the union of the replicas'
// models, each object as its replica (the first in fleet order that lists
// it) sent it, and GET /v1/models/{id} with one of them, or a 404
// model_not_found.
func (p *Proxy) serveModels(ctx *fasthttp.RequestCtx, path string) *oai.Error {
	cat, ok := p.fleet.(modelCatalog)
	if !ok {
		cat = plainCatalog{p.fleet}
	}
	ctx.SetContentType("application/json")
	if path == pathModels {
		ctx.SetBody(modelsBody(cat.ModelList()))
		return nil
	}
	id := path[len(pathModels)+1:]
	m, ok := cat.Model(id)
	if !ok {
		return modelNotFound(id)
	}
	ctx.SetBody(m.JSON)
	return nil
}

// modelNotFound is the 404 for a model that no replica serves.
func modelNotFound(id string) *oai.Error {
	return &oai.Error{Status: fasthttp.StatusNotFound, Type: "invalid_request_error", Param: "model", Code: "model_not_found",
		Message: "the model '" + id + "' does not exist or is not served by any replica"}
}

// modelsBody renders an OpenAI model list of models' objects.
func modelsBody(models []backends.Model) []byte {
	n := 32
	for _, m := range models {
		n += len(m.JSON) + 1
	}
	b := make([]byte, 0, n)
	b = append(b, `{"object":"list","data":[`...)
	for i, m := range models {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, m.JSON...)
	}
	return append(b, "]}"...)
}

// plainCatalog serves a Fleet that knows model ids only, with minimal
// objects.
type plainCatalog struct{ f Fleet }

type modelEntry struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

func (c plainCatalog) ModelList() []backends.Model {
	ids := c.f.Models()
	now := time.Now().Unix()
	out := make([]backends.Model, len(ids))
	for i, id := range ids {
		b, _ := json.Marshal(modelEntry{ID: id, Object: "model", Created: now, OwnedBy: "kvroute"}) // cannot fail: strings and an integer
		out[i] = backends.Model{ID: id, JSON: b}
	}
	return out
}

func (c plainCatalog) Model(id string) (backends.Model, bool) {
	for _, m := range c.ModelList() {
		if m.ID == id {
			return m, true
		}
	}
	return backends.Model{}, false
}
