using System.Threading.Tasks;
using Virtufin.Worker;

public class Broken : IWorker
{
    public Task<CloudEvent> ProcessAsync(CloudEvent input)
    {
        return Task.FromResult(input)   // missing semicolon
    }
}
