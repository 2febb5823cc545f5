package proxy

import "encoding/json"

type modelEntry struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

type modelList struct {
	Object string       `json:"object"`
	Data   []modelEntry `json:"data"`
}

// modelsBody renders an OpenAI model list.
func modelsBody(models []string, created int64) []byte {
	l := modelList{Object: "list", Data: make([]modelEntry, 0, len(models))}
	for _, m := range models {
		l.Data = append(l.Data, modelEntry{ID: m, Object: "model", Created: created, OwnedBy: "kvroute"})
	}
	b, _ := json.Marshal(l) // cannot fail: only strings and integers
	return b
}
