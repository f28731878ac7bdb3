-- Begin a fresh operation id; commit each one whose begin answered execute
-- (a queue per wrk thread, since its connections interleave).
local counter = 0
local thread_id = 0
local token = os.getenv("BENCH_TOKEN") or ""
local run = os.getenv("BENCH_RUN") or "r"
local begun = {}

function setup(thread)
  thread:set("id", tostring(math.random(1, 1e9)))
end

function init(args)
  thread_id = id
end

function request()
  local headers = {["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. token}
  if #begun > 0 then
    local op = table.remove(begun, 1)
    return wrk.format("POST", "/v1/operations/" .. op .. "/commit", headers,
                      '{"attempt": 1, "workflow": "bench", "receipt": {"op": "' .. op .. '"}}')
  end
  counter = counter + 1
  local op = "bench-" .. run .. "-" .. thread_id .. "-" .. counter
  return wrk.format("POST", "/v1/operations/" .. op .. "/begin", headers,
                    '{"payload": {"n": ' .. counter .. '}, "workflow": "bench"}')
end

function response(status, headers, body)
  if string.find(body, '"decision":"execute"', 1, true) then
    local op = string.match(body, '"operation_id":"([^"]+)"')
    if op then table.insert(begun, op) end
  end
end
