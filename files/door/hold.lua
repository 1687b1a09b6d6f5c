# Managed by the dual-spark deploy (tasks/door.py): edits here are overwritten.
-- (Lua skips a first line that starts with "#".) Holds a request at the front door while vLLM is
-- drained for a planned stop, so that it is not sent to a vLLM about to go. The deploy drains it
-- through the runtime API (files/dual_spark/door.py), waits for the requests in flight, stops vLLM,
-- then makes it ready again; a request held longer than DUAL_SPARK_HOLD seconds is answered 503.

local bound = tonumber(os.getenv("DUAL_SPARK_HOLD")) or 1800

local function drained(server)
  local status = server:get_stats()["status"] or ""
  return status:find("DRAIN", 1, true) ~= nil or status:find("MAINT", 1, true) ~= nil
end

core.register_action("dual_spark_hold", {"http-req"}, function(txn)
  local server = core.backends["vllm"].servers["vllm"]
  local start = core.now()
  while drained(server) do
    local now = core.now()
    if now.sec - start.sec >= bound then
      txn:set_var("txn.held_out", true)
      return
    end
    core.msleep(200)
  end
end)
