-- begin then commit of a fresh operation id, alternately, per wrk thread.
local counter = 0
local thread_id = 0
local token = os.getenv("BENCH_TOKEN") or ""
local run = os.getenv("BENCH_RUN") or "r"

function setup(thread)
  thread:set("id", tostring(math.random(1, 1e9)))
end

function init(args)
  thread_id = id
end

function request()
  counter = counter + 1
  local n = math.floor((counter + 1) / 2)
  local op = "bench-" .. run .. "-" .. thread_id .. "-" .. n
  local headers = {["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. token}
  if counter % 2 == 1 then
    return wrk.format("POST", "/v1/operations/" .. op .. "/begin", headers,
                      '{"payload": {"n": ' .. n .. '}, "workflow": "bench"}')
  end
  return wrk.format("POST", "/v1/operations/" .. op .. "/commit", headers,
                    '{"attempt": 1, "receipt": {"n": ' .. n .. '}}')
end
