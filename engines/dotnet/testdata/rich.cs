using System;
using System.Collections.Generic;
using System.Linq;
using System.Text;
using System.Threading.Tasks;
using Virtufin.Worker;
using Virtufin.Worker.Json;

// Rich is a worker using what workers commonly use beyond an echo: an
// async method, LINQ with lambdas, collections, string interpolation, an
// exception filter's shape. Its output names what it computed.
public class Rich : WorkerBase
{
    readonly Dictionary<string, int> seen = new Dictionary<string, int>();

    public Rich() : base("rich.out") { }

    public override async Task<CloudEvent> ProcessAsync(CloudEvent input)
    {
        var data = input.Data as JsonObject;
        var values = new List<double> { 1.5, 2.5, 4 };
        var total = values.Where(v => v > 2).Select(v => v * 2).Sum();
        var names = string.Join("+", values.OrderByDescending(v => v).Select(v => v.ToString("F1")));
        var sb = new StringBuilder();
        foreach (var v in values)
            sb.Append(Math.Round(v)).Append(';');
        int n;
        seen.TryGetValue(input.Id, out n);
        seen[input.Id] = n + 1;
        await Task.Delay(0);
        try {
            return Response(input, new JsonObject {
                ["total"] = total,
                ["names"] = names,
                ["rounded"] = sb.ToString(),
                ["count"] = n + 1,
                ["summary"] = $"{input.Id}:{total:F1}:{values.Count}",
                ["input"] = data == null ? null : data.DeepClone(),
            });
        } catch (ArgumentException e) {
            throw new InvalidOperationException(e.Message, e);
        }
    }
}
