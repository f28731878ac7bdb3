-- A model turn through the model gate (chat completions, not streamed): the
-- System Message names one of several tasks (BENCH_TASKS, split over the
-- threads), round-robin, as several agents would; the upstream (the stand-in
-- model, --mode final) answers a short text with its usage.
function request()
  local tasks = my_tasks()
  counter = counter + 1
  local task = tasks[(counter % #tasks) + 1]
  local headers = {["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. token}
  return wrk.format("POST", "/v1/openai/chat/completions", headers,
    '{"model": "m", "messages": [' ..
    '{"role": "system", "content": "You are an agent.\\nloopstop-task: ' .. task .. '"}, ' ..
    '{"role": "user", "content": "Where is order ORD-' .. counter .. '?"}]}')
end
