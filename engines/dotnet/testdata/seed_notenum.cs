// CommandWorker<T> over a struct that is not an enum: the original's
// `where T : struct, Enum` refuses it at compile time; mcs cannot express
// the constraint, so the host refuses it at load with the same error.
using System.Threading.Tasks;
using Virtufin.Worker.DevKit;

public struct Mode { }

public class BadModes : CommandWorker<Mode>
{
    public BadModes() : base("modes.response") { }

    protected override Task<CloudEvent> HandleAsync(CloudEvent input, Mode command, JsonNode node)
    {
        return Task.FromResult<CloudEvent>(null);
    }
}
