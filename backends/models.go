package backends

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/valyala/fastjson"
)

// Model is one model a replica serves, as the replica describes it.
type Model struct {
	// ID is the model id requests name.
	ID string
	// JSON is the model's object: as the replica's GET /v1/models listed
	// it, with every field it had (object, created, owned_by, root, parent,
	// max_model_len, permission, ...), or, for a static [Spec.Models] list,
	// {"id":...,"object":"model","created":...,"owned_by":"kvroute"} with
	// created the time the list was configured. Shared: do not modify.
	JSON []byte
}

// modelSet is an immutable list of models with a lookup set.
type modelSet struct {
	list []string       // ids, in the replica's order
	objs [][]byte       // objs[i] is list[i]'s JSON object
	set  map[string]int // index in list of each id
}

// newModelSet builds a set from ids and their objects (same length); an
// empty or repeated id is skipped, the first of a repeated id kept.
func newModelSet(ids []string, objs [][]byte) *modelSet {
	ms := &modelSet{list: make([]string, 0, len(ids)), objs: make([][]byte, 0, len(ids)), set: make(map[string]int, len(ids))}
	for i, id := range ids {
		if _, dup := ms.set[id]; dup || id == "" {
			continue
		}
		ms.set[id] = len(ms.list)
		ms.list = append(ms.list, id)
		ms.objs = append(ms.objs, objs[i])
	}
	return ms
}

// staticModel is the object of a model listed in a Spec.
type staticModel struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

// staticModelSet builds the set of a Spec.Models list, with minimal objects.
func staticModelSet(ids []string, created int64) *modelSet {
	objs := make([][]byte, len(ids))
	for i, id := range ids {
		objs[i], _ = json.Marshal(staticModel{ID: id, Object: "model", Created: created, OwnedBy: "kvroute"}) // strings and an integer: cannot fail
	}
	return newModelSet(ids, objs)
}

// equal reports whether ms and o list the same models with the same objects.
func (ms *modelSet) equal(o *modelSet) bool {
	return ms != nil && o != nil && slices.Equal(ms.list, o.list) && slices.EqualFunc(ms.objs, o.objs, bytes.Equal)
}

// parseModels reads an OpenAI model list,
// {"object":"list","data":[{"id":"...",...},...]}: the ids and each entry's
// object, re-encoded with all its fields and their values as sent. Entries
// that are not objects or have no id are skipped. The results are copies.
func parseModels(body []byte) (ids []string, objs [][]byte, err error) {
	v, err := fastjson.ParseBytes(body)
	if err != nil {
		return nil, nil, fmt.Errorf("GET /v1/models: %w", err)
	}
	data := v.Get("data")
	if data == nil || data.Type() != fastjson.TypeArray {
		return nil, nil, errors.New(`GET /v1/models: no "data" array`)
	}
	items, _ := data.Array()
	ids = make([]string, 0, len(items))
	objs = make([][]byte, 0, len(items))
	for _, it := range items {
		if it.Type() != fastjson.TypeObject {
			continue
		}
		if id := it.GetStringBytes("id"); len(id) > 0 {
			ids = append(ids, string(id))
			objs = append(objs, it.MarshalTo(nil))
		}
	}
	return ids, objs, nil
}

// ModelList returns the replica's models with their objects: the static
// list of its spec if it has one, else the last list fetched from
// GET /v1/models (nil before the first successful fetch).
func (r *Replica) ModelList() []Model {
	ms := r.modelSet()
	if ms == nil {
		return nil
	}
	out := make([]Model, len(ms.list))
	for i, id := range ms.list {
		out[i] = Model{ID: id, JSON: ms.objs[i]}
	}
	return out
}

// ModelList returns the union of the current replicas' models
// ([Replica.ModelList]) sorted by id, one entry per id: the object of the
// first replica in fleet order that lists it.
func (f *Fleet) ModelList() []Model {
	var all []Model
	seen := map[string]struct{}{}
	for _, r := range f.state.Load().list {
		ms := r.modelSet()
		if ms == nil {
			continue
		}
		for i, id := range ms.list {
			if _, dup := seen[id]; dup {
				continue
			}
			seen[id] = struct{}{}
			all = append(all, Model{ID: id, JSON: ms.objs[i]})
		}
	}
	slices.SortFunc(all, func(a, b Model) int { return strings.Compare(a.ID, b.ID) })
	return all
}

// Model returns the model id as [Fleet.ModelList] has it, and whether a
// current replica lists it.
func (f *Fleet) Model(id string) (Model, bool) {
	for _, r := range f.state.Load().list {
		ms := r.modelSet()
		if ms == nil {
			continue
		}
		if i, ok := ms.set[id]; ok {
			return Model{ID: id, JSON: ms.objs[i]}, true
		}
	}
	return Model{}, false
}
