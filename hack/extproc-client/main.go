// Command extproc-client asks an endpoint picker (the Gateway API Inference Extension's EPP) where it would
// send one request, as Envoy does over the ext_proc API: the request's headers, then its body (end of
// stream), on one Process stream; it prints the x-gateway-destination-endpoint the picker set and exits.
// modelpool's endpoint-picker test drives the real picker with it (no Envoy at hand).
//
// Usage: extproc-client -addr 127.0.0.1:9002 -body '{"model":"m","prompt":"hi"}' [-path /v1/completions]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// destinationHeader is the header the picker sets to the endpoint it chose (its metadata.DestinationEndpointKey).
const destinationHeader = "x-gateway-destination-endpoint"

func main() {
	addr := flag.String("addr", "127.0.0.1:9002", "the picker's ext_proc (gRPC) address")
	body := flag.String("body", "", "the request body (JSON)")
	path := flag.String("path", "/v1/completions", "the request's :path")
	timeout := flag.Duration("timeout", 10*time.Second, "the whole exchange's deadline")
	flag.Parse()
	endpoint, err := ask(*addr, *path, []byte(*body), *timeout)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(endpoint)
}

func header(key, value string) *corev3.HeaderValue {
	return &corev3.HeaderValue{Key: key, RawValue: []byte(value)}
}

// ask sends the headers and the body, then reads the picker's answers until one sets the destination.
func ask(addr, path string, body []byte, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return "", err
	}
	defer conn.Close()
	stream, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err != nil {
		return "", err
	}
	headers := &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
		header(":method", "POST"), header(":path", path), header(":authority", "modelpool"),
		header("content-type", "application/json"), header("content-length", fmt.Sprint(len(body))),
	}}}
	requests := []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: headers}},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}},
	}
	for _, request := range requests {
		if err := stream.Send(request); err != nil {
			return "", err
		}
	}
	for {
		answer, err := stream.Recv()
		if err != nil {
			return "", fmt.Errorf("no destination from the picker: %w", err)
		}
		if immediate := answer.GetImmediateResponse(); immediate != nil {
			return "", fmt.Errorf("the picker answered the request itself: %d %s", immediate.GetStatus().GetCode(), immediate.GetBody())
		}
		mutation := answer.GetRequestHeaders().GetResponse().GetHeaderMutation()
		for _, set := range mutation.GetSetHeaders() {
			if set.GetHeader().GetKey() == destinationHeader {
				return string(set.GetHeader().GetRawValue()), nil
			}
		}
	}
}
