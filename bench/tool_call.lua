-- Admission of a tool call, then its result, on several tasks per wrk thread
-- (BENCH_TASKS: comma-separated task ids, split evenly over the threads), as
-- several agents would: a task has at most one request in flight, so its
-- calls and results come one after another. Give each thread more tasks
-- than connections. An answer without a task id (an error, or a baseline's
-- fixed body) frees nothing: its task stays busy, and once every task is
-- busy the script picks tasks round-robin, so read the figures of a run
-- with errors with care (bench/run.py prints the non-2xx count).
local pending = {}   -- "task call" pairs admitted and not yet reported
local busy = {}      -- task id -> true while a request of its is in flight

function request()
  local tasks = my_tasks()
  counter = counter + 1
  local headers = {["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. token}
  if #pending > 0 then
    local item = table.remove(pending, 1)
    local task, call = string.match(item, "(%S+) (%S+)")
    busy[task] = true
    return wrk.format("POST", "/v1/tasks/" .. task .. "/tool-calls/" .. call .. "/result",
                      headers, '{"status": "ok", "result": {"n": ' .. counter .. '}}')
  end
  local task = nil
  for i = 0, #tasks - 1 do
    local candidate = tasks[((counter + i) % #tasks) + 1]
    if not busy[candidate] then task = candidate break end
  end
  task = task or tasks[(counter % #tasks) + 1]   -- only when tasks <= connections
  busy[task] = true
  return wrk.format("POST", "/v1/tasks/" .. task .. "/tool-calls", headers,
    '{"tool": "search", "kind": "read", "args": {"q": ' .. counter .. ', "t": "' .. task .. '"}}')
end

function response(status, headers, body)
  local task = string.match(body, '"task_id":"(t%x+)"')
  local call = string.match(body, '"call_id":"(k%x+)"')
  if task then
    if call and string.find(body, '"decision":"execute"', 1, true) then
      table.insert(pending, task .. " " .. call)   -- stays busy until its result is sent
    else
      busy[task] = nil
    end
  end
end
