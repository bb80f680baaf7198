// The original DevKit's CommandWorker<T> (where T : struct, Enum): the wire
// command is the enum member's lowercase identifier, dispatched to
// HandleAsync(input, T, node).
using System;
using System.Threading.Tasks;
using Virtufin.Worker.DevKit;

public enum WebSocketManagerCommand { create, close }

public class WebSocketManager : CommandWorker<WebSocketManagerCommand>
{
    public WebSocketManager() : base("websocket.response", "urn:seed:ws") { }

    protected override Task<CloudEvent> HandleAsync(CloudEvent input, WebSocketManagerCommand command, JsonNode node)
    {
        switch (command)
        {
            case WebSocketManagerCommand.create:
                return Task.FromResult(Response(input, new JsonObject { ["created"] = node["url"].DeepClone() }));
            case WebSocketManagerCommand.close:
                return Task.FromResult(Response(input, new JsonObject { ["closed"] = true }));
            default:
                throw new ArgumentOutOfRangeException("command");
        }
    }
}
