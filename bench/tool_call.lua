-- Admission of a tool call, then its result, alternately, on one task per thread
-- (BENCH_TASKS: comma-separated task ids, one per wrk thread).
local counter = 0
local thread_id = 0

local calls = {}   -- call ids admitted and not yet reported (one queue per wrk thread)
local token = os.getenv("BENCH_TOKEN") or ""
local tasks = {}
for t in string.gmatch(os.getenv("BENCH_TASKS") or "", "[^,]+") do table.insert(tasks, t) end
local next_index = 1

function setup(thread)
  thread:set("task", tasks[next_index])
  next_index = next_index + 1
end

function init(args)
end

function request()
  counter = counter + 1
  local headers = {["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. token}
  if #calls > 0 then
    local call = table.remove(calls, 1)
    local path = "/v1/tasks/" .. task .. "/tool-calls/" .. call .. "/result"
    return wrk.format("POST", path, headers,
      '{"status": "ok", "result": {"n": ' .. counter .. '}, "evidence": {"revision": ' .. counter .. '}}')
  end
  return wrk.format("POST", "/v1/tasks/" .. task .. "/tool-calls", headers,
    '{"tool": "search", "kind": "read", "args": {"q": ' .. counter .. '}}')
end

function response(status, headers, body)
  local found = string.match(body, '"call_id":"(k%x+)"')
  if found then table.insert(calls, found) end
end
