// argocd-health evaluates an Argo CD resource health script the way Argo CD does.
//
// Usage: argocd-health SCRIPT.lua < objects.json
//
// stdin holds a JSON list of Kubernetes objects (as the API server returns them); stdout gets
// a JSON list with one {"status", "message"} (or {"error"}) per object, in order.
// `argocd-health --version` prints the gopher-lua and gopher-json module versions it was
// built with.
//
// The Lua state is set up as Argo CD's util/lua VM sets it up for a health customization
// from argocd-cm (useOpenLibs false): no standard libraries but package, base and table (Argo
// CD adds a reduced `os`, which tessera's scripts do not use), a 1 s time limit, the object as
// the global `obj` (JSON numbers become Lua numbers), the returned table encoded with
// gopher-json and read as a health status; a status outside Argo CD's six is "Unknown" with
// Argo CD's message.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"time"

	lua "github.com/yuin/gopher-lua"
	luajson "layeh.com/gopher-json"
)

type result struct {
	Status  string `json:"status,omitempty"`
	Message string `json:"message,omitempty"`
	Error   string `json:"error,omitempty"`
}

var validStatus = map[string]bool{
	"Unknown": true, "Progressing": true, "Suspended": true, "Healthy": true,
	"Degraded": true, "Missing": true,
}

func decodeValue(L *lua.LState, value interface{}) lua.LValue {
	switch v := value.(type) {
	case bool:
		return lua.LBool(v)
	case float64:
		return lua.LNumber(v)
	case string:
		return lua.LString(v)
	case json.Number:
		return lua.LString(v)
	case []interface{}:
		arr := L.CreateTable(len(v), 0)
		for _, item := range v {
			arr.Append(decodeValue(L, item))
		}
		return arr
	case map[string]interface{}:
		tbl := L.CreateTable(0, len(v))
		for key, item := range v {
			tbl.RawSetH(lua.LString(key), decodeValue(L, item))
		}
		return tbl
	}
	return lua.LNil
}

func evaluate(script string, obj map[string]interface{}) result {
	L := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer L.Close()
	for _, lib := range []struct {
		name string
		open lua.LGFunction
	}{
		{lua.LoadLibName, lua.OpenPackage},
		{lua.BaseLibName, lua.OpenBase},
		{lua.TabLibName, lua.OpenTable},
	} {
		if err := L.CallByParam(lua.P{Fn: L.NewFunction(lib.open), NRet: 0, Protect: true},
			lua.LString(lib.name)); err != nil {
			return result{Error: err.Error()}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	L.SetContext(ctx)
	L.SetGlobal("obj", decodeValue(L, obj))
	if err := L.DoString(script); err != nil {
		return result{Error: err.Error()}
	}
	ret := L.Get(-1)
	if ret.Type() != lua.LTTable {
		return result{Error: fmt.Sprintf("expect table output from Lua script, not %s", ret.Type())}
	}
	encoded, err := luajson.Encode(ret)
	if err != nil {
		return result{Error: err.Error()}
	}
	var out result
	if err := json.Unmarshal(encoded, &out); err != nil {
		return result{Error: err.Error()}
	}
	if !validStatus[out.Status] {
		return result{Status: "Unknown", Message: "Lua returned an invalid health status"}
	}
	return out
}

func versions() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	out := ""
	for _, dep := range info.Deps {
		out += dep.Path + " " + dep.Version + "\n"
	}
	return out
}

func main() {
	if len(os.Args) == 2 && os.Args[1] == "--version" {
		fmt.Print(versions())
		return
	}
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: argocd-health SCRIPT.lua < objects.json")
		os.Exit(2)
	}
	script, err := os.ReadFile(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	input, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var objects []map[string]interface{}
	if err := json.Unmarshal(input, &objects); err != nil {
		fmt.Fprintln(os.Stderr, "stdin is not a JSON list of objects:", err)
		os.Exit(2)
	}
	results := make([]result, 0, len(objects))
	for _, obj := range objects {
		results = append(results, evaluate(string(script), obj))
	}
	if err := json.NewEncoder(os.Stdout).Encode(results); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
