# Managed by the dual-spark deploy (tasks/door.py): edits here are overwritten.
-- (Lua skips a first line that starts with "#".) The door's own counts, served in Prometheus's text
-- format on the metrics frontend (haproxy.cfg: use-service lua.dual_spark_counts), which HAProxy's
-- exporter cannot give:
--   - the requests hold.lua holds while vLLM is drained or its health check is down: how many now,
--     the longest wait now, and how long each waited once its hold ended;
--   - per client (txn.client: the name the door's map gives a key, never the key), the answers by
--     class, the door's own among them, and the tokens vLLM's answers report in their `usage`.
-- Names come from the map, which the site bounds; DUAL_SPARK_CLIENTS lists them so that each
-- starts at 0. Every count starts again from 0 when HAProxy starts or reloads.

local HELD_BUCKETS = {1, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600}
local CLASSES = {"1xx", "2xx", "3xx", "4xx", "5xx", "other"}

local function seconds()
  local now = core.now()
  return now.sec + now.usec / 1e6
end

local clients = {}  -- name -> {answers = {class -> n}, prompt = n, completion = n, without_usage = n}

local function client(name)
  local counts = clients[name]
  if not counts then
    counts = {answers = {}, prompt = 0, completion = 0, without_usage = 0}
    for _, class in ipairs(CLASSES) do counts.answers[class] = 0 end
    clients[name] = counts
  end
  return counts
end

for name in (os.getenv("DUAL_SPARK_CLIENTS") or ""):gmatch("%S+") do client(name) end

-- A count that fails never fails the request it counts (an error in a filter would answer it 400):
-- it is counted as such, and logged (a line of this file, never a request's content). What the
-- callback returned is passed on as it was: a filter's callback that returns nil, rather than
-- nothing, makes HAProxy wait.
local errors = 0

local function guarded(callback)
  return function(...)
    local result = table.pack(pcall(callback, ...))
    if result[1] then return table.unpack(result, 2, result.n) end
    errors = errors + 1
    core.Warning("dual-spark counts: " .. tostring(result[2]))
  end
end

-- The holds (hold.lua calls these): those now held by when they began, and the waits of those that ended.
local holding, next_hold = {}, 0
local held = {buckets = {}, sum = 0, count = 0, refused = 0}
for index = 1, #HELD_BUCKETS do held.buckets[index] = 0 end

door_counts = {}

function door_counts.hold_begins()
  next_hold = next_hold + 1
  holding[next_hold] = seconds()
  return next_hold
end

function door_counts.hold_ends(hold, refused)
  local waited = math.max(0, seconds() - holding[hold])  -- the clock is the wall's: never below 0
  holding[hold] = nil
  for index, bound in ipairs(HELD_BUCKETS) do
    if waited <= bound then held.buckets[index] = held.buckets[index] + 1 end
  end
  held.sum, held.count = held.sum + waited, held.count + 1
  if refused then held.refused = held.refused + 1 end
end

-- Each answer of a client's request, by class, whoever made it (vLLM, or the door: a 503 past the
-- hold's bound or after the tries): called by `http-after-response`, which sees them all.
core.register_fetches("dual_spark_answered", guarded(function(txn)
  local name = txn:get_var("txn.client")
  if not name then return nil end  -- not the API, or a key the door does not know (refused: 401)
  local status = tonumber(txn.f:status()) or 0
  local class = (status >= 100 and status < 600) and string.format("%dxx", status // 100) or "other"
  local answers = client(name).answers
  answers[class] = answers[class] + 1
  return class
end))

-- The tokens of a client's answer: vLLM's `usage`, read as the answer streams through (nothing is
-- held back). A JSON answer has one at its end; a stream has one in its last chunk if the client
-- asked (stream_options.include_usage; the Responses and Anthropic APIs always send one), and
-- with continuous usage one per chunk, each counting all so far. Per field the last value read
-- counts: OpenAI's prompt_tokens and completion_tokens, the Responses and Anthropic APIs'
-- input_tokens and output_tokens (Anthropic's stream sends its input tokens first, its output last).
-- A key inside a JSON string has its quotes escaped: only a real "usage" key matches.
local USAGE, BEGUN = '"usage"%s*:%s*(%b{})()', '"usage"%s*:%s*{'
local TAIL, LONGEST = 32, 65536  -- bytes kept across chunks: a key cut in two; an object cut in two

local Usage = {id = "dual-spark usage", flags = filter.FLT_CFG_FL_HTX}
Usage.__index = Usage

function Usage:new()
  return setmetatable({tail = ""}, Usage)
end

local function tokens(object, ...)
  for _, key in ipairs({...}) do
    local value = object:match('"' .. key .. '"%s*:%s*(%d+)')
    if value and #value <= 12 then return tonumber(value) end
  end
end

-- The method and the status by fetches: HAProxy 2.6 fails get_stline() on a request it buffered
-- whole (option http-buffer-request).
Usage.http_headers = guarded(function(self, txn, msg)
  if not msg.channel:is_resp() then return end
  local name, status = txn:get_var("txn.client"), tonumber(txn.f:status()) or 0
  if name and txn.f:method() == "POST" and status >= 200 and status < 300 then
    self.client = name
    filter.register_data_filter(self, msg.channel)
  end
end)

Usage.http_payload = guarded(function(self, txn, msg)
  local data = msg:body()
  if not data or #data == 0 then return end
  local text, after = self.tail .. data, 1
  for object, stop in text:gmatch(USAGE) do
    self.prompt = tokens(object, "prompt_tokens", "input_tokens") or self.prompt
    self.completion = tokens(object, "completion_tokens", "output_tokens") or self.completion
    after = stop
  end
  local rest = text:sub(after)
  local begun = rest:find(BEGUN)
  if begun and #rest - begun < LONGEST then
    self.tail = rest:sub(begun)
  else
    self.tail = rest:sub(-TAIL)
  end
end)

Usage.end_analyze = guarded(function(self, txn, chn)
  if not chn:is_resp() or not self.client then return end
  local counts = client(self.client)
  if self.prompt or self.completion then
    counts.prompt = counts.prompt + (self.prompt or 0)
    counts.completion = counts.completion + (self.completion or 0)
  else
    counts.without_usage = counts.without_usage + 1
  end
end)

core.register_filter("dual_spark_usage", Usage, function(usage, args)
  return usage
end)

local function label(value)  -- a name from the map: the site's [a-z][a-z0-9_-]*, escaped all the same
  return (value:gsub('[\\"\n]', {["\\"] = "\\\\", ['"'] = '\\"', ["\n"] = "\\n"}))
end

local function metric(lines, name, kind, help)
  lines[#lines + 1] = string.format("# HELP %s %s\n# TYPE %s %s", name, help, name, kind)
end

local function render()
  local lines, now, longest, count = {}, seconds(), 0, 0
  for _, began in pairs(holding) do
    count, longest = count + 1, math.max(longest, now - began)
  end
  metric(lines, "dual_spark_door_count_errors_total", "counter", "Counts that failed (logged by HAProxy): the requests they were for were served all the same.")
  lines[#lines + 1] = string.format("dual_spark_door_count_errors_total %d", errors)
  metric(lines, "dual_spark_door_held_requests", "gauge", "Requests held at the door now: vLLM drained for a planned stop, or its health check down.")
  lines[#lines + 1] = string.format("dual_spark_door_held_requests %d", count)
  metric(lines, "dual_spark_door_held_longest_seconds", "gauge", "How long the request held longest now has waited (0: none held).")
  lines[#lines + 1] = string.format("dual_spark_door_held_longest_seconds %.3f", longest)
  metric(lines, "dual_spark_door_held_seconds", "histogram", "How long each request held at the door waited, counted when its hold ended.")
  for index, bound in ipairs(HELD_BUCKETS) do
    lines[#lines + 1] = string.format('dual_spark_door_held_seconds_bucket{le="%d"} %d', bound, held.buckets[index])
  end
  lines[#lines + 1] = string.format('dual_spark_door_held_seconds_bucket{le="+Inf"} %d', held.count)
  lines[#lines + 1] = string.format("dual_spark_door_held_seconds_sum %.3f", held.sum)
  lines[#lines + 1] = string.format("dual_spark_door_held_seconds_count %d", held.count)
  metric(lines, "dual_spark_door_held_refused_total", "counter", "Requests held past the bound (serving_ready_timeout) and answered 503.")
  lines[#lines + 1] = string.format("dual_spark_door_held_refused_total %d", held.refused)
  local names = {}
  for name in pairs(clients) do names[#names + 1] = name end
  table.sort(names)
  metric(lines, "dual_spark_door_client_requests_total", "counter", "Answers to each client's API requests, by class, vLLM's and the door's own.")
  for _, name in ipairs(names) do
    for _, class in ipairs(CLASSES) do
      lines[#lines + 1] = string.format('dual_spark_door_client_requests_total{client="%s",code="%s"} %d', label(name), class,
                                        clients[name].answers[class])
    end
  end
  for _, kind in ipairs({{"prompt_tokens", "prompt", "Prompt tokens of each client's answers, as vLLM's usage reports them."},
                         {"completion_tokens", "completion", "Completion tokens of each client's answers, as vLLM's usage reports them."},
                         {"answers_without_usage", "without_usage",
                          "Each client's 2xx answers to a POST in which the door read no usage (a stream without include_usage): their tokens are not counted."}}) do
    metric(lines, "dual_spark_door_client_" .. kind[1] .. "_total", "counter", kind[3])
    for _, name in ipairs(names) do
      lines[#lines + 1] = string.format('dual_spark_door_client_%s_total{client="%s"} %d', kind[1], label(name), clients[name][kind[2]])
    end
  end
  return table.concat(lines, "\n") .. "\n"
end

core.register_service("dual_spark_counts", "http", function(applet)
  local body = render()
  applet:set_status(200)
  applet:add_header("content-type", "text/plain; version=0.0.4")
  applet:add_header("content-length", string.len(body))
  applet:start_response()
  applet:send(body)
end)
